"""``python -m tdcollect.envs.meltingpot_install``: installs MeltingPot (see ``libs/meltingpot.py``)."""
import sys

from .libs.meltingpot import main

if __name__ == "__main__":
    sys.exit(main())
