# Two commands on a fresh machine:
#   make demo   venv + install, train on the built-in zh->en corpus, translate, show where the logs are
#   make test   venv + install, run the tests
# and the guided tour of multi-head attention (installs Jupyter, an optional extra):
#   make tour   open notebooks/tour.py in JupyterLab
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH  ?= torch==2.13.0

.PHONY: demo test tour install lint clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

install: $(VENV)/.installed

demo: install
	$(PY) scripts/train.py
	$(PY) scripts/translate.py run=latest decode.beam=5 attention=outputs/showcase_attention.html \
		"我请李雷帮我订了去北京的机票。"
	$(PY) scripts/translate.py run=latest decode.beam=5 \
		"那只小猫昨天在公园里追了一只蝴蝶。" "韩梅梅明天会在图书馆里看三本书。" "他喜欢猫吗？" \
		"喜欢猫的女孩去了北京。" "因为他昨天很累，所以他没去学校。"
	@echo
	@echo "every head of the showcase sentence, interactive (open in a browser): outputs/showcase_attention.html"
	@echo "every head across training, in TensorBoard's Attention tab: $(VENV)/bin/tensorboard --logdir outputs"

test: install
	$(PY) -m pytest -q -n auto --dist loadfile --no-loadscope-reorder

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

clean:
	rm -rf $(VENV) outputs/*/ .pytest_cache
