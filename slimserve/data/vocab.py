"""Vocabularies of the synthetic dataset: job families, industries, cities and typed companies.

Company names carry a hint of their type (``Labs`` for a startup, ``Foundation`` for a non-profit...) and
item descriptions name the type outright, so a model reading a member's history can learn the member's
taste for a kind of company from text alone.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    """A job title family: its titles, its skills and the industries where it usually works."""

    name: str
    titles: tuple[str, ...]
    skills: tuple[str, ...]
    industries: tuple[str, ...]


FAMILIES: tuple[Family, ...] = (
    Family(
        "software",
        (
            "Software Engineer",
            "Backend Developer",
            "Frontend Developer",
            "DevOps Engineer",
            "Mobile Developer",
        ),
        ("python", "java", "go", "typescript", "react", "kubernetes", "aws", "sql", "docker", "rust"),
        ("software", "internet", "fintech", "telecom"),
    ),
    Family(
        "data",
        ("Data Scientist", "Data Analyst", "Data Engineer", "ML Engineer", "BI Analyst"),
        (
            "python",
            "sql",
            "statistics",
            "spark",
            "pytorch",
            "tableau",
            "machine learning",
            "airflow",
            "excel",
        ),
        ("internet", "fintech", "retail", "healthcare"),
    ),
    Family(
        "design",
        ("Product Designer", "UX Designer", "UI Designer", "Graphic Designer", "UX Researcher"),
        ("figma", "prototyping", "user research", "typography", "illustrator", "design systems", "html"),
        ("software", "media", "advertising", "retail"),
    ),
    Family(
        "sales",
        ("Account Executive", "Sales Manager", "Sales Representative", "Key Account Manager"),
        ("negotiation", "crm", "salesforce", "lead generation", "cold calling", "forecasting", "b2b sales"),
        ("software", "telecom", "manufacturing", "retail"),
    ),
    Family(
        "finance",
        ("Accountant", "Financial Analyst", "Controller", "Auditor", "Tax Advisor"),
        ("excel", "bookkeeping", "ifrs", "financial modeling", "auditing", "sap", "budgeting", "tax law"),
        ("banking", "insurance", "fintech", "consulting"),
    ),
    Family(
        "healthcare",
        ("Registered Nurse", "Pharmacist", "Physiotherapist", "Medical Assistant", "Clinical Researcher"),
        ("patient care", "triage", "pharmacology", "clinical trials", "first aid", "ehr systems", "rehab"),
        ("healthcare", "biotech", "public health"),
    ),
    Family(
        "education",
        ("Teacher", "Instructional Designer", "Tutor", "Curriculum Developer", "School Counselor"),
        ("lesson planning", "classroom management", "e-learning", "curriculum design", "mentoring", "moodle"),
        ("education", "e-learning", "public health"),
    ),
    Family(
        "marketing",
        ("Marketing Manager", "Content Writer", "SEO Specialist", "Brand Manager", "Growth Marketer"),
        ("seo", "copywriting", "google ads", "social media", "analytics", "branding", "email marketing"),
        ("advertising", "media", "retail", "internet"),
    ),
    Family(
        "operations",
        ("Operations Manager", "Supply Chain Analyst", "Project Manager", "Logistics Coordinator"),
        ("logistics", "scrum", "lean", "procurement", "erp", "planning", "inventory", "excel"),
        ("logistics", "manufacturing", "retail", "energy"),
    ),
)

INDUSTRIES: tuple[str, ...] = tuple(sorted({i for f in FAMILIES for i in f.industries}))
SKILLS: tuple[str, ...] = tuple(sorted({s for f in FAMILIES for s in f.skills}))

CITIES: tuple[str, ...] = (
    "Berlin",
    "London",
    "Paris",
    "Madrid",
    "Amsterdam",
    "Warsaw",
    "Dublin",
    "Lisbon",
    "Toronto",
    "Austin",
    "Chicago",
    "Seattle",
)

COMPANY_TYPES: tuple[str, ...] = ("startup", "enterprise", "agency", "public sector", "non-profit")

# How an item description introduces each kind of company (one short phrase each).
TYPE_PHRASES: dict[str, tuple[str, ...]] = {
    "startup": ("Fast-growing startup", "Seed-funded startup", "Young startup"),
    "enterprise": ("Global enterprise", "Large enterprise", "Fortune 500 enterprise"),
    "agency": ("Busy agency", "Boutique agency", "Client-facing agency"),
    "public sector": ("Public sector employer", "Public sector body", "Local public sector office"),
    "non-profit": ("Mission-driven non-profit", "Charity non-profit", "Community non-profit"),
}

COMPANIES: dict[str, str] = {
    # startups
    "Kitebird Labs": "startup",
    "Nimbus AI": "startup",
    "Quokka Labs": "startup",
    "Sprout.io": "startup",
    "Zephyr AI": "startup",
    "Pebble Labs": "startup",
    # enterprises
    "Globex Corporation": "enterprise",
    "Initech Group": "enterprise",
    "Contoso Corp": "enterprise",
    "Northwind Group": "enterprise",
    "Umbrella Corp": "enterprise",
    "Vandelay Group": "enterprise",
    # agencies
    "Brightside Agency": "agency",
    "Pixel Studio": "agency",
    "Redline Agency": "agency",
    "Maple Partners": "agency",
    "Oakridge Studio": "agency",
    "Tandem Partners": "agency",
    # public sector
    "City Council": "public sector",
    "Tax Authority": "public sector",
    "Health Department": "public sector",
    "Transport Authority": "public sector",
    "State University": "public sector",
    "Ministry of Labour": "public sector",
    # non-profits
    "Open Doors Foundation": "non-profit",
    "Green Future Trust": "non-profit",
    "Hope Charity": "non-profit",
    "Learning Trust": "non-profit",
    "Red Cross Chapter": "non-profit",
    "Bridges Foundation": "non-profit",
}

COMPANIES_BY_TYPE: dict[str, tuple[str, ...]] = {
    kind: tuple(name for name, t in COMPANIES.items() if t == kind) for kind in COMPANY_TYPES
}


def company_type(company: str) -> str:
    """The type of a known company (``''`` for a name not in the vocabulary)."""
    return COMPANIES.get(company, "")
