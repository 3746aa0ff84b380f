import sys

from ptspeed.cli import main

sys.exit(main())
