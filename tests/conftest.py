"""Root of the test tree. Being a conftest in a directory without ``__init__.py``, pytest (default
``prepend`` import mode) puts this directory on ``sys.path``, so the shared rig (``tests/rig.py``) imports as
``rig`` from every test directory."""
