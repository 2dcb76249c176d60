"""Deploying a trained model with CTranslate2 (an optional extra: ``pip install -e '.[ct2]'``).

* :mod:`~tinymt.ct2.convert` -- our ``Transformer`` -> CTranslate2's ``TransformerSpec``
  (every option converts exactly, or is refused in one line naming it),
* :mod:`~tinymt.ct2.export` -- ``scripts/export.py``: the model folder, published whole,
* :mod:`~tinymt.ct2.engine` -- loading an export and translating id lists with it
  (``scripts/translate.py engine=ct2``, the benchmark's CTranslate2 rows).

``ctranslate2`` itself is imported only when one of these runs, so tinymt works without it.
"""

from tinymt.ct2.convert import INSTALL, build_spec, check_exportable, require_ct2
from tinymt.ct2.engine import LoadedExport, load_export, translate_export_ids
from tinymt.ct2.export import META, QUANTIZATIONS, export_run

__all__ = [
    "INSTALL",
    "META",
    "QUANTIZATIONS",
    "LoadedExport",
    "build_spec",
    "check_exportable",
    "export_run",
    "load_export",
    "require_ct2",
    "translate_export_ids",
]
