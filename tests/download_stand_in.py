"""A stand-in for foundation-model downloads (no network in the tests)."""


def stand_in_download(monkeypatch, tmp_path, source):
    """mace-torch's cache in ``tmp_path / "cache"``, and downloads copying the file ``source``; returns
    the list of URLs fetched."""
    from mace.calculators import foundations_models as fm

    monkeypatch.setattr(fm, "get_cache_dir", lambda: str(tmp_path / "cache"))
    fetched = []

    def fake_retrieve(url, filename):
        fetched.append(url)
        with open(source, "rb") as src, open(filename, "wb") as dst:
            dst.write(src.read())
    monkeypatch.setattr("urllib.request.urlretrieve", fake_retrieve)
    return fetched
