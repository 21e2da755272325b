"""The one place gradguard's version is written: read by setuptools (pyproject ``dynamic``) and by the package."""

__all__ = ["__version__"]

__version__ = "0.1.0"
