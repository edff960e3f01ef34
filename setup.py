"""Package discovery, the one thing pyproject.toml's declarative tables cannot say here.

``registry`` and ``server`` are found with ``find_packages``, so a new subpackage ships without
anyone listing it. ``migrations/`` lives at the repository root but ships inside the package as
``registry._migrations`` (pyproject.toml's ``package-dir`` maps it), so an installed registry can
migrate its own catalog; its subpackages are found the same way.
"""

from setuptools import find_packages, setup

MIGRATIONS = "registry._migrations"

setup(
    packages=[
        *find_packages(include=["registry", "registry.*", "server", "server.*"]),
        MIGRATIONS,
        *(f"{MIGRATIONS}.{sub}" for sub in find_packages("migrations")),
    ],
)
