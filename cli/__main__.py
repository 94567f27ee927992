"""``python -m tdcollect``: the ``tdcollect`` command (see ``command.py``)."""
import sys

from tdcollect.command import main

sys.exit(main())
