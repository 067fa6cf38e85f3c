"""The subcommands of the ``fpipe`` command, one private module per family.

Each module has ``add_parsers(commands)``, which registers its subcommands with the
``argparse`` subparsers ``commands`` and sets ``run(args) -> int`` on each; :mod:`fpipe.cli`
builds the parser from them and maps exceptions to exit statuses.
"""

__all__: list[str] = []
