"""The exercise notebooks' checkers: :mod:`~infergraph_lite.exercises.feedback` and one module per lesson.

:mod:`.feedback` holds what every checker shares (``Feedback``, the ``checker`` decorator, ``require``);
``lesson01`` ... ``lesson07`` hold each notebook's checkers and import only what those need, so the checks of
notebook 02 do not load Triton.  A notebook imports its own lesson's module::

    from infergraph_lite.exercises import lesson05 as checks
"""
