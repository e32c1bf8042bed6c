"""The kernels tilecarve tunes, one directory per family (``matmul/``), each on one protocol.

``protocol.py`` is that protocol (:class:`~templates.protocol.Template`), the flow every family shares
(:class:`~templates.protocol.TemplateBase`: the target resolved once, ``compile``, ``tuner``, ``tune``)
and :class:`~templates.protocol.TuneOptions`; ``config.py`` the base of every family's config.
``docs/templates.md`` says how to add a family.
"""
