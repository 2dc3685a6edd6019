"""instructor on its default mode (TOOLS) against a running `starling serve`.

instructor pins `jiter` below what the newest `openai` needs, so run.sh gives it its own
virtual environment with the `openai` it resolves.
"""

import os

import pytest
from pydantic import BaseModel, Field

BASE = os.environ.get("STARLING_API_BASE")
CHAT = os.environ.get("STARLING_TEST_LLM_NAME", "smollm2-135m-instruct")

pytestmark = pytest.mark.skipif(BASE is None, reason="run through tests/python/run.sh")


class City(BaseModel):
    name: str = Field(max_length=24)
    country: str = Field(max_length=24)


def test_tools_mode_returns_a_validated_model():
    import instructor
    from openai import OpenAI

    client = instructor.from_openai(OpenAI(base_url=BASE, api_key="unused-on-localhost", max_retries=0))
    assert client.mode == instructor.Mode.TOOLS  # the default
    city = client.chat.completions.create(
        model=CHAT,
        response_model=City,
        messages=[{"role": "user", "content": "Name a city in Italy."}],
        temperature=0,
        max_tokens=80,
        max_retries=0,  # no second try: the first answer must validate
    )
    assert isinstance(city, City)
