"""The interactive attention viewer: every head of every layer of the three attention
kinds, for the probe sentences, across training.

* :mod:`~tinymt.viewer.document` -- the *view document* of one sentence at one step
  (tokens, 8-bit weights, entropy, gold cells): what every view draws;
* :mod:`~tinymt.viewer.summary` -- documents as TensorBoard summaries (the trainer logs
  them at every validation) and back, through one checked, bounded reader (``decode``);
* :mod:`~tinymt.viewer.metadata` -- a probe tag's metadata, written and version-checked;
* :mod:`~tinymt.viewer.plugin` -- the **Attention** tab of TensorBoard;
* :mod:`~tinymt.viewer.html` -- the same view as one self-contained HTML file
  (``translate.py attention=maps.html``, the tour notebook);
* ``static/view.js`` -- the view itself (plain JavaScript), ``static/index.js`` -- its
  TensorBoard entry.

Import the submodules directly: the TensorBoard plugin must not pull in torch.
"""
