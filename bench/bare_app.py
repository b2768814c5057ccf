"""The baseline for bench/api_submit.py: a bare FastAPI + SQLModel endpoint that inserts a row."""

from __future__ import annotations

import os
import uuid

from fastapi import FastAPI
from sqlmodel import Field, Session, SQLModel, create_engine


class BareJob(SQLModel, table=True):
    __tablename__ = "bare_job"
    id: str = Field(primary_key=True)
    name: str
    payload: str


engine = create_engine(os.environ["BARE_DATABASE_URL"], pool_size=10, max_overflow=20)
SQLModel.metadata.create_all(engine)
app = FastAPI()


@app.post("/v1/jobs", status_code=201)
def insert(body: dict) -> dict:
    with Session(engine) as session:
        row = BareJob(id=uuid.uuid4().hex, name=str(body.get("name")), payload=str(body))
        session.add(row)
        session.commit()
        return {"id": row.id}
