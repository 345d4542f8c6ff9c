"""``python -m exo_p2p`` runs the ``exo-p2p`` command line."""

from exo_p2p.cli.main import main

if __name__ == "__main__":
    main()
