from shoal.cli import main
import sys
sys.exit(main())
