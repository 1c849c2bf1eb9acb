"""MMLU subject -> (category, subcategory), the grouping of Hendrycks et al. (2021), used as
the region tree ``category/subcategory/subject`` of the RouteLLM MMLU routing data."""

_SUBCATEGORY = {
    "math": ("abstract_algebra college_mathematics elementary_mathematics "
             "high_school_mathematics high_school_statistics"),
    "health": ("anatomy clinical_knowledge college_medicine human_aging medical_genetics "
               "nutrition professional_medicine virology"),
    "physics": "astronomy college_physics conceptual_physics high_school_physics",
    "business": "business_ethics management marketing",
    "biology": "college_biology high_school_biology",
    "chemistry": "college_chemistry high_school_chemistry",
    "computer_science": ("college_computer_science computer_security "
                         "high_school_computer_science machine_learning"),
    "economics": "econometrics high_school_macroeconomics high_school_microeconomics",
    "engineering": "electrical_engineering",
    "philosophy": ("formal_logic logical_fallacies moral_disputes moral_scenarios philosophy "
                   "world_religions"),
    "other": "global_facts miscellaneous professional_accounting",
    "history": ("high_school_european_history high_school_us_history "
                "high_school_world_history prehistory"),
    "geography": "high_school_geography",
    "politics": ("high_school_government_and_politics public_relations security_studies "
                 "us_foreign_policy"),
    "psychology": "high_school_psychology professional_psychology",
    "culture": "human_sexuality sociology",
    "law": "international_law jurisprudence professional_law",
}

_CATEGORY = {
    "stem": "physics chemistry biology computer_science math engineering",
    "humanities": "history philosophy law",
    "social_sciences": "politics culture economics geography psychology",
    "other": "other business health",
}

SUBJECT_GROUPS: dict[str, tuple[str, str]] = {
    subject: (category, sub)
    for category, subs in _CATEGORY.items() for sub in subs.split()
    for subject in _SUBCATEGORY[sub].split()
}
