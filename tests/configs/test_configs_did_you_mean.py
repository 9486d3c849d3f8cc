"""A misspelt field gets a did-you-mean wherever a config is loaded."""

from __future__ import annotations

import pytest

from posttrain.configs import load_config
from posttrain.configs.cluster import load_cluster
from posttrain.errors import ConfigError


def test_a_misspelt_field_or_section_is_named_with_the_nearest():
    with pytest.raises(ConfigError, match=r"trainer.lrr: unknown field; did you mean lr\?; allowed: "):
        load_config(None, ["trainer.lrr=1e-4"])
    with pytest.raises(ConfigError, match=r"tranier: unknown field; did you mean trainer\?"):
        load_config(None, ["tranier.lr=1e-4"])
    with pytest.raises(ConfigError, match=r"did you mean max_staleness( or |\?)"):
        load_config(None, ["pipeline.max_stalenes=2"])


def test_a_cluster_file_field_too(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text("workers: {generate: 1, execute: 1, verifyy: 1}\n")
    with pytest.raises(ConfigError, match=r"workers.verifyy: unknown field; did you mean verify\?"):
        load_cluster(path)
