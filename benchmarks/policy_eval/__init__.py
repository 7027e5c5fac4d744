"""The trigger-policy cost–accuracy evaluation behind ``driftline bench policies``.

``stream`` lays a stream (MovieLens spread out, or the generator at the trace's true
arrivals) over a trace in virtual time with its drifts, ``ladder`` trains the models a
job can swap in, ``runtimes`` says how long a job takes and what it costs on functions
or VMs, ``run`` replays one policy on one runtime, ``figures`` turns runs into the
reported figures and ``report`` draws the plots and writes the markdown.
"""
