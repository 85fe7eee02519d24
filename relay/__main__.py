import sys

from relay.cli.main import main

sys.exit(main())
