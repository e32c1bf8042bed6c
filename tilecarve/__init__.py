"""tilecarve's command line and reports: ``tilecarve --help`` (``tilecarve/cli.py``, ``docs/cli.md``).

The library itself is the ``carver``, ``autotuner`` and ``templates`` packages; this package only
drives them from a shell. Importing it imports nothing heavy.
"""

__all__: list[str] = []
