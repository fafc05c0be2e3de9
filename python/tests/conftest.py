import os
import sys

# The tests import the harness beside them.
sys.path.insert(0, os.path.dirname(__file__))
