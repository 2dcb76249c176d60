"""Hydra composition: every shipped config composes; typos and wrong types are errors."""

import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

import tinymt.config  # noqa: F401  (registers schemas)
from tinymt.config import TrainConfig

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
EXPERIMENTS = sorted(p.stem for p in (CONFIGS / "experiment").glob("*.yaml"))
GROUPS = {g: sorted(p.stem for p in (CONFIGS / g).glob("*.yaml"))
          for g in ("data", "model", "optim", "trainer")}


def _compose(overrides=(), name="train"):
    with initialize_config_dir(version_base="1.3", config_dir=str(CONFIGS)):
        return compose(config_name=name, overrides=list(overrides))


def test_default_config_is_typed_and_complete():
    cfg = _compose()
    assert cfg.data.source == "builtin" and cfg.model.name == "tiny"
    # the composed config has exactly the schema's keys
    schema = OmegaConf.structured(TrainConfig)
    for group in ("data", "model", "optim", "trainer"):
        assert set(cfg[group].keys()) == set(schema[group].keys()), group


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes(experiment):
    cfg = _compose([f"experiment={experiment}"])
    assert cfg.trainer.max_steps > 0
    OmegaConf.to_container(cfg, resolve=True)  # every interpolation resolves


@pytest.mark.parametrize("group,option", [(g, o) for g, opts in GROUPS.items() for o in opts])
def test_every_group_option_composes(group, option):
    cfg = _compose([f"{group}={option}"])
    assert cfg[group].name == option


def test_there_are_options_for_each_group():
    assert set(GROUPS["model"]) >= {"tiny", "small", "base"}
    assert set(GROUPS["data"]) >= {"builtin_zh_en", "multi30k", "tatoeba_zh_en"}
    assert len(EXPERIMENTS) >= 3


@pytest.mark.parametrize("override", ["model.n_head=4", "trainer.max_step=10", "optim.learning_rate=1"])
def test_typo_in_override_is_an_error(override):
    with pytest.raises(ConfigCompositionException) as e:
        _compose([override])
    assert override.split("=")[0].split(".")[-1] in str(e.value.__cause__ or e.value)


def test_wrong_type_is_an_error():
    with pytest.raises(ConfigCompositionException) as e:
        _compose(["model.d_model=wide"])
    assert isinstance(e.value.__cause__, ValidationError)


def test_typo_in_a_yaml_file_is_an_error(tmp_path):
    # copy the configs, add a typo'd key to one group file: composition must fail
    import shutil

    shutil.copytree(CONFIGS, tmp_path / "configs")
    tiny = tmp_path / "configs" / "model" / "tiny.yaml"
    tiny.write_text(tiny.read_text() + "n_layer: 6  # typo\n")
    with initialize_config_dir(version_base="1.3", config_dir=str(tmp_path / "configs")):
        with pytest.raises(ConfigCompositionException) as e:
            compose(config_name="train")
    assert "Key 'n_layer' not in 'ModelConfig'" in str(e.value)


def test_every_yaml_key_has_a_comment():
    for path in CONFIGS.rglob("*.yaml"):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            s = line.strip()
            if not s or s.startswith("#") or s.startswith("- ") or s.endswith(":"):
                continue  # comments, defaults-list entries, section headers
            assert re.search(r"\s#\s", line), f"{path.relative_to(CONFIGS)}:{n} has no comment"


def test_translate_config_composes():
    cfg = _compose(["decode.beam=5", "decode.len_penalty=0.6"], name="translate")
    assert cfg.decode.beam == 5 and cfg.run == "latest"
    with pytest.raises(ConfigCompositionException):
        _compose(["decode.beams=5"], name="translate")
