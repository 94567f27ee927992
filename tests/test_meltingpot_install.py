"""The MeltingPot installer's pieces: the stand-in assets tarball and the extra's requirements."""
import tarfile

from tdcollect.envs.libs import meltingpot as install


def test_assets_tarball_holds_only_the_empty_models_folder(tmp_path):
    path, written = install.write_empty_assets(str(tmp_path / "assets.tar.gz"))
    assert written
    with tarfile.open(path) as tar:
        members = {m.name: m.isdir() for m in tar.getmembers()}
    assert members == {"assets": True, "assets/saved_models": True}


def test_a_valid_tarball_is_left_alone_and_a_broken_file_replaced(tmp_path):
    path = str(tmp_path / "assets.tar.gz")
    install.write_empty_assets(path)
    before = open(path, "rb").read()
    assert install.write_empty_assets(path) == (path, False)
    assert open(path, "rb").read() == before
    with open(path, "wb") as f:
        f.write(b"not a tarball")
    assert install.write_empty_assets(path) == (path, True)
    assert tarfile.is_tarfile(path)


def test_default_path_is_where_meltingpots_build_looks():
    import tempfile

    assert install.assets_path() == f"{tempfile.gettempdir()}/meltingpot-assets-2.3.0.tar.gz"


def test_extra_requirements_come_from_the_package_metadata():
    requirements = install.extra_requirements()
    assert "dm-meltingpot==2.4.1" in requirements
    assert any(req.startswith("pettingzoo") for req in requirements)
