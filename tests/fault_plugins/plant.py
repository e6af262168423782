"""Test-only pytest plugin: plants an entry in the run directory just before a chosen test runs, as someone who can
write there would. CKPTQUAL_PLANT_BEFORE: a test name; CKPTQUAL_PLANT: "directory" (the first checkpoint's directory
as a symlink to CKPTQUAL_PLANT_OUTSIDE), "file" (its first file as a symlink to CKPTQUAL_PLANT_OUTSIDE), "layouts"
(the odd layouts' directory replaced by a symlink to CKPTQUAL_PLANT_OUTSIDE) or "fifo" (the first file of every kept
checkpoint replaced by a FIFO); load with `-p plant`.
"""

import os

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    if item.name != os.environ["CKPTQUAL_PLANT_BEFORE"]:
        return
    qualification = item.funcargs["qualification"]
    what, outside = os.environ["CKPTQUAL_PLANT"], os.environ.get("CKPTQUAL_PLANT_OUTSIDE", "")
    first_file = qualification.settings.plan.ranks[0].files[0].path
    if what == "directory":
        qualification.fill.checkpoint_dir(0).symlink_to(outside, target_is_directory=True)
    elif what == "file":
        link = qualification.fill.checkpoint_dir(0) / first_file
        link.parent.mkdir(parents=True)
        link.symlink_to(outside)
    elif what == "layouts":
        (qualification.run_dir / "layouts").rmdir()
        (qualification.run_dir / "layouts").symlink_to(outside, target_is_directory=True)
    else:
        for _, directory in qualification.fill.retained:
            (directory / first_file).unlink()
            os.mkfifo(directory / first_file)
