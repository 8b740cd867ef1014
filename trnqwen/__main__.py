"""``python -m trnqwen`` runs the CLI."""

from trnqwen.cli.main import main

if __name__ == "__main__":
    main()
