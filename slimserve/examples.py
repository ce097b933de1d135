"""A built-in example member and candidate jobs, for the demo request, the parity check and benchmarks.

Deterministic (seeded) so the same candidates come back on every machine.
"""

from __future__ import annotations

import random

from .schema import Activity, ActivityKind, Item, ItemKind, Member, Seniority

EXAMPLE_MEMBER = Member(
    id="m-demo-1",
    headline="Backend engineer building low-latency recommendation services",
    skills=("python", "go", "grpc", "kubernetes", "postgresql", "machine learning"),
    seniority=Seniority.SENIOR,
    years_experience=7,
    location="Berlin",
    industries=("software", "internet"),
    open_to_remote=True,
    history=(
        Activity("Platform Engineer", "Hooli", "internet", ActivityKind.ENGAGED),
        Activity("Accountant", "Initech", "finance", ActivityKind.DISMISSED),
        Activity("Senior Python Developer", "Stark Data", "software", ActivityKind.ENGAGED),
    ),
)

# (title, required skills, industry, the level the title names or None: drawn at random)
_TITLES = (
    ("Senior Backend Engineer", ("python", "grpc", "postgresql"), "software", Seniority.SENIOR),
    ("Machine Learning Engineer, Ranking", ("python", "machine learning", "pytorch"), "internet", None),
    ("Site Reliability Engineer", ("kubernetes", "go", "prometheus"), "software", None),
    ("Data Analyst", ("sql", "excel", "tableau"), "retail", None),
    ("Registered Nurse", ("patient care", "triage"), "healthcare", None),
    ("Frontend Developer", ("typescript", "react", "css"), "internet", None),
    ("Staff Platform Engineer", ("go", "kubernetes", "terraform"), "software", Seniority.LEAD),
    ("Sales Development Representative", ("negotiation", "crm"), "software", None),
    ("Accountant", ("bookkeeping", "ifrs", "excel"), "finance", None),
    ("Search Relevance Engineer", ("python", "information retrieval", "machine learning"), "internet", None),
)
_COMPANIES = (
    "Acme Cloud",
    "Northwind",
    "Globex",
    "Initech",
    "Umbrella Health",
    "Hooli",
    "Vandelay",
    "Stark Data",
)
# Places as the synthetic dataset writes them (a city alone): the generator student, trained on those, read
# "London, UK; the member is in Berlin, Germany" as the same-city fact (docs/generator-build.md, "Measured:
# cities with a country"). Munich is not a dataset city.
_CITIES = ("Berlin", "Munich", "London", "Paris", "Austin", "Remote")
_LEVELS = (Seniority.ENTRY, Seniority.MID, Seniority.SENIOR, Seniority.LEAD)


def example_candidates(count: int = 10, seed: int = 7) -> list[Item]:
    """``count`` varied job postings (ids ``job-000``...), deterministic for a seed; a title that names a
    level ("Senior", "Staff") has that level."""
    rng = random.Random(seed)
    items = []
    for index in range(count):
        title, skills, industry, titled_level = _TITLES[index % len(_TITLES)]
        city = rng.choice(_CITIES)
        company = rng.choice(_COMPANIES)
        level = rng.choice(_LEVELS)  # drawn for every title: the other draws stay as they were
        items.append(
            Item(
                id=f"job-{index:03d}",
                kind=ItemKind.JOB,
                title=title,
                company=company,
                required_skills=skills,
                seniority=titled_level or level,
                location=city,
                remote=city == "Remote" or rng.random() < 0.2,
                industry=industry,
                description=f"Join {company} as a {title.lower()} working with {', '.join(skills)}.",
            )
        )
    return items
