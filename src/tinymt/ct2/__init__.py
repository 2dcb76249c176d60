"""Deploying a trained model with CTranslate2 (an optional extra: ``pip install -e '.[ct2]'``).

:mod:`~tinymt.ct2.convert` maps our ``Transformer`` onto CTranslate2's ``TransformerSpec``
(exactly), :mod:`~tinymt.ct2.export` writes the model folder
(``scripts/export.py``), :mod:`~tinymt.ct2.engine` loads an export and translates with it
(``translate.py engine=ct2``). ``ctranslate2`` is imported only when one of these runs.
"""

from tinymt.ct2.convert import require_ct2
from tinymt.ct2.engine import LoadedExport, export_attention, load_export, translate_export_ids
from tinymt.ct2.export import export_run

__all__ = ["LoadedExport", "export_attention", "export_run", "load_export", "require_ct2",
           "translate_export_ids"]
