"""`python -m keras_scaling` runs the `keras-scaling` command line."""

import sys

from keras_scaling.cli import main

sys.exit(main())
