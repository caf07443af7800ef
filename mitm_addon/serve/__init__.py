"""Serve mode: intercepted calls answered by the policy under training, token in, token out.

``conversation`` turns an API request into chat-template messages, ``completion``
parses the policy's output back, ``replies`` builds the API-shaped answer, ``splice``
keeps the exact ids of earlier turns and classifies each call's drift, ``renderer``
applies the policy's chat template, ``policy`` calls the policy server and
``handler`` ties them together for one call. Only ``renderer`` and ``policy`` do I/O.
"""
