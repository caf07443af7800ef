"""``forge view``: self-contained HTML pages of rollouts' call trees.

``model`` holds the data a page shows, ``conversation`` splits a call's conversation
into what is new in it, ``load`` reads both from the pipeline's DuckDB views, and
``page`` renders HTML from them (pure; CSS and JS from ``assets/`` are inlined).
"""
