import sys

from dtok.cli import main

sys.exit(main())
