"""The plan model (pure: stdlib and numpy): model and cluster specs, the Plan and PlanColumns, the
rank layout, validation, memory, communication and step-time formulas, TP scaling, the plan report.
Each formula is written once, for one plan or a column of plans (vector.py). Never imports torch.
"""
