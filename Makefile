# Two commands on a fresh machine:
#   make demo   venv + install, train on the built-in zh->en corpus, translate, show where the logs are
#   make test   venv + install, run the tests
# and the guided tour of multi-head attention (installs Jupyter, an optional extra):
#   make tour   open notebooks/tour.py in JupyterLab
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH  ?= torch==2.13.0

.PHONY: demo test tour install lint clean mutation gpu

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[dev]'
	# tests/test_libretranslate_page.py: LibreTranslate's own web page (its files only)
	$(PY) -m pip install -q --no-deps 'libretranslate==1.9.6'
	touch $@

install: $(VENV)/.installed

demo: install
	$(PY) scripts/train.py
	$(PY) scripts/translate.py run=latest decode.beam=5 \
		"那只小猫昨天在公园里追了一只蝴蝶。" "韩梅梅明天会在图书馆里看三本书。" "他喜欢猫吗？" \
		"喜欢猫的女孩去了北京。" "因为他昨天很累，所以他没去学校。"
	@# last, this run's story: the relations its heads track over the test split, then the
	@# showcase sentence and the head of this run that carries each of its relations
	$(PY) scripts/analyze_heads.py run=latest split=test max_sentences=0 pruning=false
	$(PY) scripts/translate.py run=latest decode.beam=5 attention=outputs/showcase_attention.html \
		"我请李雷帮我订了去北京的机票。"
	@echo
	@echo "every head of the showcase sentence, interactive (open in a browser): outputs/showcase_attention.html"
	@echo "every head across training, in TensorBoard's Attention tab: $(VENV)/bin/tensorboard --logdir outputs"

# the three pytest plugins the suite uses, named: pytest rewrites the asserts of every module of
# an auto-loaded plugin's package (hypothesis, hydra, anyio: ~170 modules a worker, ~2 s
# where no bytecode cache is written, as on a clean clone)
test: install
	PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 $(PY) -m pytest -p xdist -p hypothesispytest -p pytest_timeout \
		-q -n auto --dist loadfile --no-loadscope-reorder

# Every GPU figure in one call (a CUDA build of torch: make gpu TORCH='torch==2.13.0
# --index-url https://download.pytorch.org/whl/cu128'): a minute of the default run on the GPU
# (its steps/s), 60 s of the Multi30k recipe (its test BLEU; a validation every 100 steps for
# the average of the last five, without the PNG grids: ~1.6 s of CPU each), the benchmark's
# CUDA sections for small at the recipe's batch (8,192 tokens) and base at about the paper's
# (32,768), decoding the recipe's model, merged into docs/benchmarks.* (commit first: the
# report names the commit; docs/benchmarks.md); then the CUDA tests (last: a failing one
# leaves the figures made).
# MULTI30K: Multi30k in the hub's layout, on disk (the benchmark reads no hub)
MULTI30K ?= ../shared/data/multi30k-hub-layout
gpu: install
	rm -rf outputs/gpu  # this call's own runs, made anew
	$(PY) scripts/train.py trainer.device=cuda trainer.max_minutes=1 run_dir=outputs/gpu/default
	$(PY) scripts/train.py experiment=multi30k_de_en data.path=$(MULTI30K) \
		trainer.max_minutes=1 trainer.valid_every=100 trainer.attention_images=false \
		run_dir=outputs/gpu/multi30k
	$(PY) scripts/benchmark.py --device cuda --sizes small base --max-tokens 8192 32768 --steps 20 \
		--warmup 5 --repeats 2 --data-path $(MULTI30K) --run outputs/gpu/multi30k \
		--merge docs/benchmarks.json --json docs/benchmarks.json --out docs/benchmarks.md
	$(PY) -m pytest -q -rs -m cuda

# The guided tour of multi-head attention. Jupyter is an optional extra (.[tour]); the tour
# lives in git as notebooks/tour.py (jupytext), paired with a git-ignored tour.ipynb that
# Jupyter opens and keeps in sync with it.
$(VENV)/.tour-installed: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[tour]'
	touch $@

tour: $(VENV)/.tour-installed
	$(VENV)/bin/jupytext --sync notebooks/tour.py
	$(VENV)/bin/jupyter lab notebooks/tour.ipynb

lint: install
	$(VENV)/bin/ruff check src scripts tests notebooks

# Mutation testing of the core (mutmut; [tool.mutmut] in pyproject.toml): every mutant of
# these functions is run against their fast unit tests, then a count per module and the
# survivors are printed (mutmut browse / mutmut show NAME: the diffs). Works incrementally.
MUTATION_SCOPE := "tinymt.attention.*" "tinymt.layers.*" "tinymt.model.*" "tinymt.loss.*" \
	"tinymt.step.*" "tinymt.batching.*" "tinymt.decoding.*" \
	"tinymt.tokenizer.x*encode_sampled__mutmut_*" "tinymt.tokenizer.x*_sampling_tables__mutmut_*" \
	"tinymt.trainer.optim.x_lr_factor__mutmut_*" "tinymt.checkpoint.x_average_checkpoints__mutmut_*"

mutation: install
	OMP_NUM_THREADS=1 $(VENV)/bin/mutmut run --max-children $${JOBS:-2} $(MUTATION_SCOPE) || true
	@$(VENV)/bin/mutmut results | grep -v ": not checked" || true
	@$(VENV)/bin/mutmut results --all true | awk -F': ' '$$2 != "not checked" { \
	  m = $$1; sub(/^ +/, "", m); sub(/\.x[^.]*$$/, "", m); n[m]++; s[m, $$2]++ } \
	  END { printf "%-26s %7s %7s %8s %7s %10s %8s\n", "module", "mutants", "killed", \
	        "survived", "timeout", "suspicious", "no tests"; fflush(); \
	    for (m in n) printf "%-26s %7d %7d %8d %7d %10d %8d\n", m, n[m], s[m, "killed"], \
	      s[m, "survived"], s[m, "timeout"], s[m, "suspicious"], s[m, "no tests"] | "sort" }'

clean:
	rm -rf $(VENV) outputs/*/ .pytest_cache
