"""The trigger-policy cost–accuracy evaluation behind ``driftline bench policies``.

``stream`` lays MovieLens over a trace in virtual time and trains the model ladder,
``runtimes`` says how long a job takes and what it costs on functions or VMs, ``run``
replays one policy on one runtime, ``figures`` turns runs into the reported figures and
``report`` draws the plots and writes the markdown.
"""
