"""Operations on the Snakemake/DVC pipeline itself: which package code each DVC stage runs
(its import closure, ``code_closure.py``) and dvc.yaml's code deps written from it
(``dvc_deps.py``, ``hwgptbench dvc-deps``)."""
