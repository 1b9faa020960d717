"""`ftsup sim`: a discrete-event fleet simulator that drives the real supervisor core in virtual time.

model.py: the inputs and the closed-form numbers (MTBF, failures, Young/Daly, analytic ETTR);
schedule.py: where training time goes between failures; fleet.py: the adapter that feeds the
pure core (`decide`/`evolve`) the inputs failures produce; engine.py: the event loop that turns
the core's decisions into time; stats.py and cli.py: replications, confidence intervals, output.
"""
