"""The params models: one typed model per params.yaml section (:mod:`.sections`,
:mod:`.compress`), the whole document (:mod:`.document`), the field types they share
(:mod:`.fields`) and their cross-field problems (:mod:`.problems`); the loader is
:mod:`hwgptbench.params`."""
