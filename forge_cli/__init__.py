"""The ``forge`` command line."""
