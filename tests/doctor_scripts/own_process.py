"""Planted: the training runs in a process the script starts itself (subprocess), which the doctor does
not follow: the report says so, with the command, the line and the output's end."""

import os
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
subprocess.run([sys.executable, os.path.join(here, "clean_plain.py")], check=True)  # STARTS
print("the worker finished")
