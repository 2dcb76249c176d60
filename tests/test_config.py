"""Hydra composition: every shipped config composes; typos and wrong types are errors;
the schemas' defaults are the YAML's; every value is checked in tinymt.config."""

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

import tinymt.config  # noqa: F401  (registers schemas)
from tinymt.config import (
    ATTENTION_KINDS,
    AnalyzeConfig,
    AverageConfig,
    DataConfig,
    ExportConfig,
    ModelConfig,
    OptimConfig,
    PrepareConfig,
    ServeConfig,
    TrainConfig,
    TrainerConfig,
    TranslateConfig,
    as_train_config,
    check_analyze,
    check_average,
    check_data,
    check_export,
    check_translate,
)
from tinymt.errors import TinyMTError

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


# ----------------------------------------------------------------------------- defaults
SCHEMAS = {"train": TrainConfig, "prepare_data": PrepareConfig, "translate": TranslateConfig,
           "export": ExportConfig, "analyze_heads": AnalyzeConfig,
           "average_checkpoints": AverageConfig, "serve": ServeConfig}
GROUP_SCHEMAS = {"data": DataConfig, "model": ModelConfig, "optim": OptimConfig,
                 "trainer": TrainerConfig}


def _yaml(path: Path) -> dict:
    """A YAML file's own keys and values (no defaults list, no hydra settings)."""
    values = OmegaConf.to_container(OmegaConf.load(path))
    return {k: v for k, v in values.items() if k not in ("defaults", "hydra")}


def _default_options(name: str) -> dict[str, str]:
    """``{group: option}`` of a script YAML's defaults list (``data: builtin_zh_en``...)."""
    entries = OmegaConf.to_container(OmegaConf.load(CONFIGS / f"{name}.yaml"))["defaults"]
    return {k: v for e in entries if isinstance(e, dict) for k, v in e.items()
            if k in GROUP_SCHEMAS and v is not None}


@pytest.mark.parametrize("group", GROUP_SCHEMAS)
def test_group_defaults_are_the_default_yaml(group):
    """Each group's schema defaults = its file in the default composition, key for key."""
    option = _default_options("train")[group]
    schema = OmegaConf.to_container(OmegaConf.structured(GROUP_SCHEMAS[group]))
    assert _yaml(CONFIGS / group / f"{option}.yaml") == schema, f"{group}/{option}.yaml"


@pytest.mark.parametrize("name", SCHEMAS)
def test_script_defaults_are_their_yaml(name):
    """A script YAML's own keys = its schema's (the groups it composes: the test above)."""
    groups = _default_options(name)
    schema = OmegaConf.to_container(OmegaConf.structured(SCHEMAS[name]))
    assert _yaml(CONFIGS / f"{name}.yaml") == {k: v for k, v in schema.items() if k not in groups}


@pytest.mark.parametrize("name", SCHEMAS)
def test_default_composition_is_the_schema(name):
    assert OmegaConf.to_container(_compose(name=name)) == OmegaConf.to_container(
        OmegaConf.structured(SCHEMAS[name]))


def test_a_drift_on_either_side_is_seen(tmp_path):
    @dataclass
    class Wider(ModelConfig):
        d_model: int = 256

    def schema(cls):
        return OmegaConf.to_container(OmegaConf.structured(cls))

    tiny = CONFIGS / "model" / "tiny.yaml"
    assert _yaml(tiny) == schema(ModelConfig) and _yaml(tiny) != schema(Wider)
    edited = tmp_path / "tiny.yaml"
    edited.write_text(tiny.read_text().replace("d_model: 128 ", "d_model: 256 "))
    assert _yaml(edited) != schema(ModelConfig)


# ----------------------------------------------------------------------------- checks
def test_every_shipped_config_passes_the_checks():
    for experiment in EXPERIMENTS:
        as_train_config(_compose([f"experiment={experiment}"]))
    for group, options in GROUPS.items():
        for option in options:
            extra = ["data.path=corpus"] if option == "text_files" else []
            as_train_config(_compose([f"{group}={option}", *extra]))
    check_translate(_compose(name="translate"))
    check_export(_compose(["out=exports/new-model"], name="export"))
    check_analyze(_compose(name="analyze_heads"))
    check_average(_compose(name="average_checkpoints"))
    check_data(_compose(name="prepare_data").data)


def test_attention_kinds_are_the_models():
    from tinymt.model import KINDS

    assert ATTENTION_KINDS == KINDS


@pytest.mark.parametrize("cfg,words", [
    ({"model": {"n_head": 4}}, "bad config: model.n_head: Key 'n_head' not in 'ModelConfig'"),
    ({"model": {"d_model": "wide"}}, "bad config: model.d_model: Value 'wide'"),
    ({"optim": {"min_lr": 0.1, "lr": 0.01}}, "optim.min_lr=0.1 is above optim.lr=0.01"),
    ({"trainer": {"keep_last": 2, "average_last": 3}}, "trainer.average_last=3 needs"),
    ({"model": {"d_model": 10, "n_heads": 4}}, "model.d_model=10 is not divisible by"),
    ({"data": {"source": "text"}}, "data.source=text needs data.path"),
    ({"data": {"src_lang": "de"}}, "zh and en"),
    ({"trainer": {"max_minutes": float("inf")}}, "trainer.max_minutes=inf: must be a finite"),
])
def test_train_config_errors_are_one_line(cfg, words):
    with pytest.raises(TinyMTError) as e:
        as_train_config(cfg)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_data_checks_take_a_dataclass(tmp_path):
    check_data(DataConfig(source="text", path="corpus", src_lang="de", tgt_lang="en"))
    (tmp_path / "file").write_text("x")
    for bad, words in ((dict(vocab_size=4), "data.vocab_size=4: must be an integer in [8, "),
                       (dict(cache_dir=str(tmp_path / "file")), "data.cache_dir="),
                       (dict(source="tsv", path="x.tsv", src_column=0, tgt_column=0),
                        "data.src_column and data.tgt_column are both 0"),
                       (dict(source="ftp"), "data.source='ftp': choose one of")):
        with pytest.raises(TinyMTError, match=re.escape(words)):
            check_data(DataConfig(**bad))


def test_translate_checks_between_keys():
    with pytest.raises(TinyMTError, match="no room"):
        check_translate(_compose(["decode.max_len_a=0", "decode.max_len_b=0"], name="translate"))
    check_translate(_compose(["decode.beam=4", "decode.nbest=4", "output=translations.txt",
                              "attention_kinds=[cross,encoder_self]"], name="translate"))


def test_translate_engine_checks():
    check_translate(_compose(["engine=ct2", "model_dir=exports/m", "decode.beam=5"],
                             name="translate"))
    for overrides, words in ((["engine=ct2"], "engine=ct2 needs model_dir="),
                             (["model_dir=exports/m"], "add engine=ct2"),
                             (["engine=ct2", "model_dir=m", "attention=a.png"], "PyTorch engine"),
                             (["engine=ct2", "model_dir=m", "device=mps"], "cpu or cuda")):
        with pytest.raises(TinyMTError, match=words):
            check_translate(_compose(overrides, name="translate"))
