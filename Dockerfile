# Cobalt for a team: one image for the dashboard/API (gunicorn) and the workers.
# Built by docker-compose.yml; the experiment project is mounted at /project at run time.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# git: runs record the commit of the project they ran.
RUN apt-get update \
    && apt-get install -y --no-install-recommends git \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/cobalt
COPY pyproject.toml constraints.txt README.md manage.py ./
COPY cobalt ./cobalt
COPY cobalt_app ./cobalt_app
COPY cobalt_cli ./cobalt_cli
COPY cobalt_project ./cobalt_project
COPY templates ./templates
COPY static ./static
# The tested versions of every dependency (constraints.txt, refreshed by scripts/lock).
RUN pip install -c constraints.txt .
# Static files hashed and compressed once, here (the web server would otherwise collect them
# into a cache folder when it starts).
ENV COBALT_STATIC_ROOT=/opt/cobalt/static-collected
RUN cd /tmp && COBALT_SECRET_KEY=build-only python /opt/cobalt/manage.py collectstatic --noinput -v0

# What the experiment files import (your agent's own packages), e.g.
# `COBALT_PROJECT_PACKAGES="langchain-openai==0.3.0" docker compose build`.
ARG PROJECT_PACKAGES=""
RUN if [ -n "$PROJECT_PACKAGES" ]; then pip install $PROJECT_PACKAGES; fi

RUN useradd --create-home --uid 1000 cobalt \
    && git config --system --add safe.directory '*'
USER cobalt
WORKDIR /project
ENV COBALT_PROJECT_DIR=/project
