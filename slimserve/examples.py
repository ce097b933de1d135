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

_TITLES = (
    ("Senior Backend Engineer", ("python", "grpc", "postgresql"), "software"),
    ("Machine Learning Engineer, Ranking", ("python", "machine learning", "pytorch"), "internet"),
    ("Site Reliability Engineer", ("kubernetes", "go", "prometheus"), "software"),
    ("Data Analyst", ("sql", "excel", "tableau"), "retail"),
    ("Registered Nurse", ("patient care", "triage"), "healthcare"),
    ("Frontend Developer", ("typescript", "react", "css"), "internet"),
    ("Staff Platform Engineer", ("go", "kubernetes", "terraform"), "software"),
    ("Sales Development Representative", ("negotiation", "crm"), "software"),
    ("Accountant", ("bookkeeping", "ifrs", "excel"), "finance"),
    ("Search Relevance Engineer", ("python", "information retrieval", "machine learning"), "internet"),
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
    """``count`` varied job postings (ids ``job-000``...), deterministic for a seed."""
    rng = random.Random(seed)
    items = []
    for index in range(count):
        title, skills, industry = _TITLES[index % len(_TITLES)]
        city = rng.choice(_CITIES)
        company = rng.choice(_COMPANIES)
        items.append(
            Item(
                id=f"job-{index:03d}",
                kind=ItemKind.JOB,
                title=title,
                company=company,
                required_skills=skills,
                seniority=rng.choice(_LEVELS),
                location=city,
                remote=city == "Remote" or rng.random() < 0.2,
                industry=industry,
                description=f"Join {company} as a {title.lower()} working with {', '.join(skills)}.",
            )
        )
    return items
