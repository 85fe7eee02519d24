import sys

from relay.cli.entry import main

sys.exit(main())
