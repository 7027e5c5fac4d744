"""Collection rules for the doctests of the packages (``--doctest-modules``).

The torch worker (``functions/gpu.py``) imports torch at module level; without the
``gpu`` extra installed its doctests cannot be collected, so it is left out.
"""

import importlib.util

collect_ignore = [] if importlib.util.find_spec("torch") else ["functions/gpu.py"]
