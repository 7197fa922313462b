"""Integrations: one module per outside library whose models linattn serves.

Imported only on request, never at ``import linattn``: ``import linattn.integrations.transformers``
needs nothing outside linattn until ``apply`` or ``enable`` is called, which need ``transformers``
(the ``linattn[integrations]`` extra); ``linattn.integrations.fla`` imports fla only in ``enable``
(docs/design.md, "Integrations").
"""
