"""``python -m streamrec``: the same CLI as the ``streamrec`` script."""

from streamrec.cli import main

main()
