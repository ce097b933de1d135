"""Pairs with their skills renamed to real skills the synthetic dataset never uses.

A generator student distilled only on the dataset's 65 skills learns to recall those names, not to copy
the pair's: given a member with ``grpc`` and ``postgresql`` it wrote "you have python, crm and postear".
Explanation prompts whose skills are renamed (consistently within a pair: a shared skill stays shared)
teach it to copy what the facts say. The demo's skills outside the dataset (``slimserve.examples``) are
left out of this list on purpose, so the demo stays a check on skills the student has never seen.

``HELD_OUT_SKILLS`` are in neither list (the demo's among them): the build's evaluation renames held-out
pairs to them, so its grounding figures on those pairs measure copying names no training prompt had.
"""

from __future__ import annotations

import random
from dataclasses import replace

from .splits import Example

RENAMING_SKILLS: tuple[str, ...] = (
    # software and data
    "c++", "c#", "kotlin", "swift", "scala", "ruby", "php", "elixir", "haskell", "perl", "bash",
    "graphql", "rest apis", "kafka", "rabbitmq", "redis", "mongodb", "cassandra", "elasticsearch",
    "mysql", "snowflake", "bigquery", "dbt", "hadoop", "flink", "tensorflow", "jax", "scikit-learn",
    "pandas", "numpy", "computer vision", "nlp", "reinforcement learning", "data visualization",
    "power bi", "looker", "matlab", "ansible", "jenkins", "github actions", "azure",
    "google cloud", "linux", "networking", "cybersecurity", "penetration testing", "unity", "vue",
    "angular", "node.js", "django", "flask", "spring", "android", "ios", "embedded c", "fpga",
    # design and marketing
    "sketch", "after effects", "indesign", "motion design", "ux writing", "accessibility",
    "content strategy", "public relations", "market research", "brand strategy", "video editing",
    "photography", "hubspot", "marketo", "affiliate marketing", "community management",
    # business, finance, operations, sales
    "account management", "business development", "contract law", "compliance", "risk management",
    "payroll", "accounts payable", "gaap", "valuation", "treasury", "quickbooks", "netsuite",
    "supply chain", "warehousing", "six sigma", "kaizen", "quality assurance", "vendor management",
    "customer success", "zendesk", "okrs", "stakeholder management", "change management",
    "project management", "jira", "product management", "pricing", "recruiting", "onboarding",
    # health and education
    "phlebotomy", "wound care", "radiology", "physiotherapy", "nutrition", "telehealth",
    "medical coding", "iv therapy", "special education", "tutoring", "instructional design",
    "early childhood education", "assessment design", "stem outreach", "sign language",
    # trades and languages
    "welding", "carpentry", "cad", "autocad", "solidworks", "plc programming", "hvac",
    "electrical wiring", "forklift operation", "spanish", "french", "mandarin", "arabic", "german",
)  # fmt: skip


# Skills no training prompt uses (neither the dataset nor RENAMING_SKILLS), the demo's first; long and
# multi-token names on purpose (the student garbled "postgresql" into "postql").
HELD_OUT_SKILLS: tuple[str, ...] = (
    "grpc", "postgresql", "prometheus", "terraform", "css", "information retrieval",
    "webassembly", "clickhouse", "opentelemetry", "istio", "nginx", "dynamodb", "sqlite", "fortran",
    "cobol", "erlang", "ocaml", "flutter", "svelte", "tailwind", "blender", "premiere pro", "grafana",
    "kubeflow", "mlflow", "onnx", "cuda", "protobuf", "webpack", "prisma", "neo4j", "memcached",
    "zookeeper", "pulumi", "argo cd", "datadog", "splunk", "alteryx", "stata", "spss", "xero",
    "anesthesia", "dialysis", "oncology", "pediatrics", "sonography", "montessori", "braille",
    "cnc machining", "pipefitting", "plumbing", "solar installation", "japanese", "korean",
    "portuguese", "swahili",
)  # fmt: skip


def renamed_skills(example: Example, rng: random.Random, names: tuple[str, ...] = RENAMING_SKILLS) -> Example:
    """``example`` with each distinct skill of the pair (member's and item's) replaced by a different
    skill of ``names``, the same everywhere it appears."""
    skills = sorted(set(example.member.skills) | set(example.item.required_skills))
    mapping = dict(zip(skills, rng.sample(names, len(skills)), strict=True))
    member = replace(example.member, skills=tuple(mapping[s] for s in example.member.skills))
    item = replace(example.item, required_skills=tuple(mapping[s] for s in example.item.required_skills))
    return replace(example, member=member, item=item)


def with_renamed_share(examples: list[Example], share: float, seed: int) -> list[Example]:
    """``examples`` in order, every one whose seeded draw falls below ``share`` with renamed skills."""
    rng = random.Random(seed)
    return [renamed_skills(e, rng) if rng.random() < share else e for e in examples]
