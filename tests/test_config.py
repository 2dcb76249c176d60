"""Hydra composition: every shipped config composes; typos and wrong types are errors;
the schemas' defaults are the YAML's; every value is checked in tinymt.config."""

import math
import re
import typing
from dataclasses import dataclass, fields
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from hypothesis import example, given
from hypothesis import strategies as st
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ValidationError

import tinymt.config  # noqa: F401  (registers schemas)
from tinymt.config import (
    MAX_BEAM_TOKENS,
    MAX_PARAMETERS,
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
    allowed_values,
    as_train_config,
    check_analyze,
    check_average,
    check_data,
    check_export,
    check_serve,
    check_train,
    check_translate,
    check_values,
    estimated_parameters,
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
@pytest.mark.slow
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


@pytest.mark.parametrize("cfg,words", [
    ({"model": {"n_head": 4}}, "bad config: model.n_head: Key 'n_head' not in 'ModelConfig'"),
    ({"model": {"d_model": "wide"}}, "bad config: model.d_model: Value 'wide'"),
    ({"trainer": {"keep_last": 2, "average_last": 3}}, "trainer.average_last=3 needs"),
    ({"model": {"d_model": 10, "n_heads": 4}}, "model.d_model=10 is not divisible by"),
    ({"data": {"source": "text"}}, "data.source=text needs data.path"),
    ({"data": {"src_lang": "de"}}, "zh and en"),
    ({"trainer": {"max_minutes": float("inf")}}, "trainer.max_minutes=inf: must be in [0, "),
])
def test_train_config_errors_are_one_line(cfg, words):
    with pytest.raises(TinyMTError) as e:
        as_train_config(cfg)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_data_checks_take_a_dataclass(tmp_path):
    check_data(DataConfig(source="text", path="corpus", src_lang="de", tgt_lang="en"))
    (tmp_path / "file").write_text("x")
    for bad, words in ((dict(vocab_size=4), "data.vocab_size=4: must be in [8, "),
                       (dict(cache_dir=str(tmp_path / "file")), "data.cache_dir="),
                       (dict(source="ftp"), "data.source='ftp': choose one of")):
        with pytest.raises(TinyMTError, match=re.escape(words)):
            check_data(DataConfig(**bad))


def test_translate_takes_a_full_n_best_list():
    check_translate(_compose(["decode.beam=4", "decode.nbest=4", "output=translations.txt",
                              "attention_kinds=[cross,encoder_self]"], name="translate"))


def test_translate_engine_checks():
    check_translate(_compose(["engine=ct2", "model_dir=exports/m", "decode.beam=5"],
                             name="translate"))
    for overrides, words in ((["engine=ct2"], "engine=ct2 needs model_dir="),
                             (["model_dir=exports/m"], "add engine=ct2"),
                             (["engine=ct2", "model_dir=m", "decode.beam_rule=shrink"], "full"),
                             (["engine=ct2", "model_dir=m", "attention=a.png"], "PyTorch engine"),
                             (["decode.nbest=3"], "at most decode.beam=1"),
                             (["decode.beam=2", "decode.nbest=3"], "at most decode.beam=2")):
        with pytest.raises(TinyMTError, match=words):
            check_translate(_compose(overrides, name="translate"))


# ----------------------------------------------------------------------------- properties
# What a value may be, stated once as properties: the keys come from the schemas themselves
# (every int / float field of every script's schema), the values are drawn (bounded
# strategies, the "tinymt" profile of conftest.py). OmegaConf checks each value's type
# first (``model.d_model=wide``: tests above); what it lets through meets the field's own
# check (each script's wiring to its check: tests/test_cli_errors.py, one row a script).
CHECKS = {  # schema -> the check its script runs right after composition
    TrainConfig: check_train, PrepareConfig: lambda c: check_data(c.data),
    TranslateConfig: check_translate, ServeConfig: check_serve, ExportConfig: check_export,
    AnalyzeConfig: check_analyze, AverageConfig: check_average,
}
BOUNDS = re.compile(r"must be in ([\[(])([^,]+), ([^\])]+)([\])])( \(.*\))?")


def _field_type(schema, key: str):
    head, _, rest = key.partition(".")
    f = next(f for f in fields(schema) if f.name == head)
    return _field_type(f.default_factory, rest) if rest else typing.get_type_hints(schema)[head]


def _numeric_kind(annotation) -> type | None:
    """``int`` or ``float`` for a number field (``int | None`` too), None for the rest
    (strings, lists of numbers: ``optim.betas``)."""
    if typing.get_origin(annotation) in (list, dict):
        return None
    kinds = [k for k in (typing.get_args(annotation) or (annotation,)) if k in (int, float)]
    return kinds[0] if kinds else None


def _numeric_rules() -> list[tuple[type, str, type, tuple]]:
    """``(schema, key, int or float, (lo, hi, lo_open, hi_open))`` of every number field
    of every script's schema: the interval read from its check's own message (nan is
    refused by every one)."""
    out = []
    for schema in CHECKS:
        for key, allowed in allowed_values(schema).items():
            kind = _numeric_kind(_field_type(schema, key))
            if kind is None:
                continue
            m = BOUNDS.fullmatch(allowed(math.nan) or "")
            assert m, f"{schema.__name__}.{key}: a number without a stated interval"
            lo, hi = (int(x) if kind is int else float(x) for x in m.group(2, 3))
            out.append((schema, key, kind, (lo, hi, m.group(1) == "(", m.group(4) == ")")))
    return out


NUMERIC = _numeric_rules()


def test_every_number_field_has_a_finite_stated_interval():
    """The generator's own check: it sees every script's numbers, and no number is
    unbounded (every ``hi`` finite and within what the libraries take)."""
    keys = {(s.__name__, k) for s, k, _, _ in NUMERIC}
    assert {("TrainConfig", "trainer.seed"), ("TrainConfig", "optim.lr"),
            ("TranslateConfig", "decode.len_penalty"), ("ServeConfig", "port"),
            ("AnalyzeConfig", "prune"), ("AverageConfig", "last"),
            ("PrepareConfig", "data.vocab_size")} <= keys
    assert not any(k in ("trainer.resume", "optim.betas") for _, k in keys)
    assert len(keys) >= 70
    for _, key, _, (lo, hi, _, _) in NUMERIC:
        assert math.isfinite(lo) and math.isfinite(hi) and hi <= 2**32, key


def _inside(value, bounds) -> bool:
    lo, hi, lo_open, hi_open = bounds
    return (lo < value if lo_open else lo <= value) and (value < hi if hi_open else value <= hi)


@st.composite
def _numeric_case(draw, hostile: bool | None = None):
    """``(schema, key, kind, bounds, value)``: a number field and a value drawn around and
    beyond its interval (its ends, one past them, huge, non-finite, the other number type,
    a bool, a string); ``hostile``: only typed values outside (True)."""
    schema, key, kind, bounds = draw(st.sampled_from(NUMERIC))
    lo, hi, _, _ = bounds
    ends = [lo, hi] if kind is int else [float(lo), float(hi)]
    near = [e + d for e in ends for d in ((-1, 1) if kind is int else (-1e-9, 1e-9))]
    values = st.one_of(
        st.sampled_from(ends + near),
        st.integers(min_value=int(hi) + 1, max_value=2**80),  # past the top, to 2**80
        st.integers(min_value=-2**80, max_value=math.ceil(lo) - 1),
        st.sampled_from([10**30, 2**64, math.inf, -math.inf, math.nan, 1e308, -1e308]),
        st.floats(min_value=float(lo), max_value=float(hi)),  # inside (a float: kind's?)
        st.integers(min_value=math.ceil(lo), max_value=math.floor(hi)),
        st.booleans(), st.text(max_size=6))
    if hostile:
        values = values.filter(lambda v: isinstance(v, (int, float)) and not isinstance(
            v, bool) and (kind is float or isinstance(v, int)) and not _inside(v, bounds))
    return schema, key, kind, bounds, draw(values)


def _set(schema, key: str, value) -> DictConfig | None:
    """The schema's typed defaults with ``key=value`` (as Hydra composes an override), or
    None when OmegaConf refuses the value's type (a bool, a word, a fraction for an int)."""
    cfg = OmegaConf.structured(schema)
    try:
        OmegaConf.update(cfg, key, value)
    except ValidationError:
        return None
    return cfg


@given(_numeric_case())
@example((TrainConfig, "trainer.seed", int, (0, 2**32 - 1, False, False), 2**64))
@example((TranslateConfig, "decode.len_penalty", float, (-10.0, 10.0, False, False), 1e308))
@example((TrainConfig, "trainer.max_steps", int, (1, 10**9, False, False), True))
def test_a_number_check_allows_exactly_its_stated_interval(case):
    """Every value OmegaConf lets into a number field (of its type: never a bool) is
    accepted by the field's check iff inside the interval its message states: 0, -1, huge,
    inf, nan refused wherever the message says so, the interval's own ends accepted."""
    schema, key, kind, bounds, value = case
    cfg = _set(schema, key, value)
    if cfg is None:
        assert isinstance(value, (bool, str)) or kind is int, (key, value)
        return
    typed = OmegaConf.select(cfg, key)
    assert type(typed) is kind, (key, value)
    assert (allowed_values(schema)[key](typed) is None) == _inside(typed, bounds), (key, value)


FUZZ_VALUES = (0, -1, 10**30, 2**64, math.inf, -math.inf, math.nan, 1.5)


def test_every_number_key_at_its_ends_and_the_fuzz_values():
    """Every number key of every script (not a sample): its interval's ends and one past
    them, and the values users get wrong (0 / -1 / 10**30 / 2**64 / inf / nan, a
    fraction), accepted iff inside, and each refused one exactly ``<key>=<value!r>: <what
    it may be>`` from :func:`check_values` (the whole check: the property after this)."""
    for schema, key, kind, bounds in NUMERIC:
        lo, hi, _, _ = bounds
        step = 1 if kind is int else 1e-9
        allowed = allowed_values(schema)[key]
        cfg = OmegaConf.structured(schema)  # one a key: each value replaces the one before
        for value in (lo, hi, lo - step, hi + step, *FUZZ_VALUES):
            try:
                OmegaConf.update(cfg, key, value)
            except ValidationError:  # a float for an int (a fraction, inf, nan): OmegaConf's
                assert kind is int and isinstance(value, float), (key, value)  # refusal
                continue
            typed = OmegaConf.select(cfg, key)
            if _inside(typed, bounds):
                assert allowed(typed) is None, (key, value)
                continue
            with pytest.raises(TinyMTError) as e:
                check_values(cfg, schema)
            assert str(e.value) == f"{key}={typed!r}: {allowed(typed)}", (key, str(e.value))


@given(_numeric_case(hostile=True))
def test_a_hostile_number_is_one_line_naming_the_key_from_the_script_s_check(case):
    """Through the very check each script calls (``check_translate``, ``check_train``...)
    on a config that is valid but for the drawn key: exactly ``<key>=<value!r>: <what it
    may be>``, one line, before any rule between keys or any work."""
    schema, key, _, _, value = case
    cfg = _set(schema, key, value)
    with pytest.raises(TinyMTError) as e:
        CHECKS[schema](cfg)
    shown = OmegaConf.select(cfg, key)
    assert str(e.value) == f"{key}={shown!r}: {allowed_values(schema)[key](shown)}", str(e.value)


KEY_PARTS = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12)


@given(st.sampled_from(["data", "model", "optim", "trainer", None]), KEY_PARTS,
       st.one_of(st.integers(), st.text(max_size=5), st.none()))
def test_an_unknown_key_is_one_line_naming_it(group, name, value):
    """A key no schema has (a run holding one could not be resumed) is OmegaConf's own
    one-line error naming it; a known key never is."""
    schema = GROUP_SCHEMAS[group] if group else TrainConfig
    known = {f.name for f in fields(schema)}
    cfg = {group: {name: value}} if group else {name: value}
    if name in known:
        return
    with pytest.raises(TinyMTError) as e:
        as_train_config(cfg)
    dotted, message = f"{group}.{name}" if group else name, str(e.value)
    assert message.startswith(f"bad config: {dotted}: Key '{name}' not in"), message
    assert "\n" not in message


@pytest.mark.parametrize("override", ["+foo=1", "+trainer.foo=1"])
def test_a_key_hydra_adds_is_refused_by_name(override):
    """``+trainer.foo=1`` composes (Hydra adds the key to its config); merged onto the
    schema as plain values, it is the same one line."""
    key = override[1:].split("=")[0]
    with pytest.raises(TinyMTError) as e:
        as_train_config(_compose([override]))
    schema = "TrainerConfig" if "." in key else "TrainConfig"
    assert str(e.value) == f"bad config: {key}: Key 'foo' not in '{schema}'", str(e.value)


@given(st.sampled_from([(s, k) for s, k, kind, _ in NUMERIC if s is TrainConfig and kind is int]),
       st.one_of(st.text(alphabet="abcxyz -", min_size=1, max_size=6), st.lists(st.integers(), max_size=2)))
def test_a_value_of_another_type_is_one_line_naming_the_key(case, value):
    """A run's config (or a dict) with a word or a list for an integer: ``bad config:
    <key>: ...`` in one line (OmegaConf's multi-line error cut to its first)."""
    _, key = case
    group, name = key.split(".")
    with pytest.raises(TinyMTError) as e:
        as_train_config({group: {name: value}})
    assert str(e.value).startswith(f"bad config: {key}: ") and "\n" not in str(e.value)


CHOICES = [(s, k, allowed) for s in CHECKS for k, allowed in allowed_values(s).items()
           if isinstance(allowed, tuple)] + [(TrainConfig, "trainer.device", None)]


@given(st.sampled_from(CHOICES), st.one_of(st.text(max_size=12), st.sampled_from(
    ["cpu", "cuda:0", "cuda:x", "CPU", "torch ", "bpe", "meta", "auto", "fp16", "valid"])))
def test_a_choice_takes_only_its_words(case, word):
    """Every choice key (``engine``, ``trainer.device``, ``data.source``...) takes exactly
    its words (``cuda:N`` for a device), and nothing else: one line listing them."""
    schema, key, words = case
    cfg = OmegaConf.structured(schema)
    OmegaConf.update(cfg, key, word)
    if words is None:
        expected = re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", word) is not None
    else:
        expected = word in words
    try:
        check_values(cfg, schema)
        refused = None
    except TinyMTError as e:
        refused = str(e)
    assert (refused is None) == expected, (key, word, refused)
    if refused:
        assert refused.startswith(f"{key}={word!r}: choose one of ") and "\n" not in refused


SIZES = st.fixed_dictionaries({
    "d_model": st.integers(1, 2**16), "d_ff": st.integers(1, 2**16),
    "n_encoder_layers": st.integers(1, 256), "n_decoder_layers": st.integers(1, 256),
    "max_positions": st.integers(2, 2**16)})


@given(SIZES, st.integers(8, 2**20))
@example({"d_model": 16384, "d_ff": 65536, "n_encoder_layers": 64, "n_decoder_layers": 2,
          "max_positions": 256}, 2000)  # each size allowed, together far beyond memory
def test_a_model_too_large_for_memory_is_refused_whatever_sizes_make_it(sizes, vocab):
    """Each size inside its own bound, the model refused iff its estimated parameters
    exceed MAX_PARAMETERS, in one line giving the estimate and every size it counts."""
    cfg = OmegaConf.structured(TrainConfig)
    cfg.model.update(sizes, n_heads=1)
    cfg.data.vocab_size = vocab
    n = estimated_parameters(cfg)
    if n <= MAX_PARAMETERS:
        check_train(cfg)
        return
    with pytest.raises(TinyMTError) as e:
        check_train(cfg)
    assert str(e.value).startswith(f"the model would have about {n:,} parameters (model.d_model="
                                   f"{sizes['d_model']}") and "\n" not in str(e.value)


@given(st.integers(1, 256), st.integers(1, 2**18), st.integers(1, 256),
       st.sampled_from([TrainConfig, TranslateConfig, ServeConfig]))
@example(256, 262144, 1, TrainConfig)
@example(256, 4096, 256, TranslateConfig)  # the largest search the limits allow
def test_a_batch_of_hypotheses_is_bounded(beam, tokens, nbest, schema):
    """beam x batch tokens (training's test set: test_beam x max_tokens) is at most
    MAX_BEAM_TOKENS; decode.nbest is at most decode.beam, and the server takes none (it takes
    n-best lists from each request). Refused iff past them, one line naming the keys (the
    rules' order)."""
    cfg = OmegaConf.structured(schema)
    if schema is TrainConfig:
        cfg.trainer.test_beam, cfg.trainer.max_tokens = beam, tokens
        bad = beam * tokens > MAX_BEAM_TOKENS
        names = ("trainer.test_beam", "trainer.max_tokens")
    else:
        cfg.decode.beam, cfg.decode.batch_tokens, cfg.decode.nbest = beam, tokens, nbest
        bad = beam * tokens > MAX_BEAM_TOKENS or nbest > beam or (schema is ServeConfig
                                                                  and nbest != 1)
        names = ("decode.beam", "decode.batch_tokens") if beam * tokens > MAX_BEAM_TOKENS \
            else ("decode.nbest", "decode.beam") if nbest > beam else ("decode.nbest",)
    if not bad:
        CHECKS[schema](cfg)
        return
    with pytest.raises(TinyMTError) as e:
        CHECKS[schema](cfg)
    assert all(f"{n}=" in str(e.value) for n in names) and "\n" not in str(e.value), str(e.value)


def test_parameter_estimate_bounds_the_model():
    """The cross rule's estimate is the real count plus exactly what it counts on purpose:
    the tables tied away after they were made, sinusoidal positions (buffers as large) and
    the final norms of pre-LN (counted for post-LN too)."""
    from tinymt.model import Transformer, count_parameters

    for overrides in ({}, {"model": {"tie_embeddings": False, "positional": "learned"}},
                      {"data": {"joint_vocab": False}},
                      {"model": {"d_model": 64, "n_heads": 8, "d_ff": 32, "norm_first": False,
                                 "n_encoder_layers": 3, "n_decoder_layers": 1}}):
        cfg = OmegaConf.merge(OmegaConf.structured(TrainConfig), overrides)
        m, v = cfg.model, cfg.data.vocab_size
        model = Transformer(m, v, v, shared_vocab=cfg.data.joint_vocab)
        tables = {id(t.weight) for t in (model.src_embed, model.tgt_embed, model.output_proj)}
        extra = ((3 - len(tables)) * v * m.d_model
                 + (2 * m.max_positions * m.d_model if m.positional == "sinusoidal" else 0)
                 + (0 if m.norm_first else 4 * m.d_model))
        assert estimated_parameters(cfg) == count_parameters(model) + extra, overrides
