"""pytest plugin: attach the numerics checks a test made (lowlat.numerics.RECORDS) to its report as
`user_properties` ("numerics", record), so `lowlat signoff` can list them (xdist carries them over).

Loaded by the repo's conftest.py and by `lowlat signoff` (`-p lowlat.pytest_plugin`)."""

import pytest

from lowlat import numerics


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    numerics.RECORDS.clear()
    yield
    for rec in numerics.RECORDS:
        item.user_properties.append(("numerics", rec))
    numerics.RECORDS.clear()
