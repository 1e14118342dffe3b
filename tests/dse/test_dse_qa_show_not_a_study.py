"""``dse show`` on a folder that holds no study says so, as ``dse report`` and ``dse ui``
do. Before, it said "no pareto.csv; run `dse search` (or `dse report DIR`)", and
``dse report DIR`` then failed with "not a dse search folder"."""

from __future__ import annotations

from dse.cli import main


def test_show_on_a_folder_without_a_study(tmp_path, capsys):
    for args in (["show", str(tmp_path)], ["show", str(tmp_path), "--all"]):
        assert main(args) == 2
        err = capsys.readouterr().err.strip()
        assert err.splitlines() == [err], err
        assert "not a dse search folder (no study.json)" in err, err
        assert "dse report" not in err, err
