import sys

from .cleanup import Interrupted
from .cli import main

try:
    sys.exit(main())
except Interrupted as e:
    print(f"{e}", file=sys.stderr)
    sys.exit(130)
