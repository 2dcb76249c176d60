"""The interactive attention viewer: every head of every layer of the three attention
kinds, for the probe sentences, across training (docs/viewer.md).

:mod:`~tinymt.viewer.document` builds the *view document* of one sentence at one step;
:mod:`~tinymt.viewer.summary` packs documents into TensorBoard summaries and reads them back
(checked, bounded); :mod:`~tinymt.viewer.plugin` is TensorBoard's **Attention** tab;
:mod:`~tinymt.viewer.html` the same view as one self-contained HTML file. :data:`STATIC`
holds ``view.js`` (the view itself) and ``index.js`` (its TensorBoard entry).

Import the submodules directly: the TensorBoard plugin must not pull in torch.
"""

from pathlib import Path

STATIC = Path(__file__).resolve().parent / "static"
