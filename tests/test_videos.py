"""Video generation jobs through the `openai` SDK against live servers, on the tiny recipe text-to-video
models (TextToVideoSD and Wan) pushed through the artifact path: create (with every form of input
reference), remix, the content's three variants; a restart test kills the server mid-job."""

from __future__ import annotations

import base64
import io
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from modelhost.config import Settings
from tests.conftest import make_settings
from tests.helpers import ADMIN_KEY, assert_error, bearer, deployment_metric, push_folder_sync
from tests.live import live_server
from tests.server_process import ServerProcess

FAST = {"num_inference_steps": 2, "seed": 1}


@dataclass
class Videos:
    url: str
    key: str
    http: httpx.Client
    deployments: dict[str, str]
    settings: Settings | None = None
    account_id: str = ""

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=self.key, max_retries=0)

    def post(self, **body: Any) -> httpx.Response:
        return self.http.post("/v1/videos", json=body, headers=bearer(self.key))

    def wait(
        self, video_id: str, until: tuple[str, ...] = ("completed", "failed"), timeout: float = 120
    ) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = self.http.get(f"/v1/videos/{video_id}", headers=bearer(self.key)).json()
            if job["status"] in until:
                return job
            time.sleep(0.05)
        raise TimeoutError(job)


def deploy(http: httpx.Client, key: str, folder: Path, model: str) -> str:
    artifact = push_folder_sync(http, key, folder, "text-to-video")
    created = http.post(
        "/v1/deployments", json={"model": model, "artifact_id": artifact}, headers=bearer(key)
    )
    assert created.status_code == 201, created.text
    deployment_id: str = created.json()["id"]
    return deployment_id


@pytest.fixture(scope="module")
def videos(tmp_path_factory: pytest.TempPathFactory, recipes: Path) -> Iterator[Videos]:
    root = tmp_path_factory.mktemp("videos")
    settings = make_settings(
        root,
        f"sqlite:///{root / 'db.sqlite'}",
        worker_threads=1,
        video_poll_seconds=0.05,
        video_poll_after_ms=50,
        media_allow_networks=["127.0.0.0/8"],
        shutdown_drain_seconds=0,  # at the module's end: nothing left running is worth waiting for
    )
    with live_server(settings) as url:
        http = httpx.Client(base_url=url, timeout=120)
        account = http.post("/v1/admin/accounts", json={"name": "v"}, headers=bearer(ADMIN_KEY)).json()
        key = account["api_key"]
        folder = recipes / "t14_diffusers_text_to_video"
        deployments = {
            "t2v": deploy(http, key, folder / "text_to_video_sd", "t2v"),
            "wan": deploy(http, key, folder / "wan", "wan"),
        }
        yield Videos(url, key, http, deployments, settings, account["id"])
        http.close()


def frames_of(mp4: bytes) -> tuple[int, int, int, float]:
    import av

    with av.open(io.BytesIO(mp4)) as container:
        stream = container.streams.video[0]
        count = sum(1 for _ in container.decode(stream))
        return count, stream.width, stream.height, float(stream.average_rate or 0)


def png_bytes() -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(
        buffer, "PNG"
    )
    return buffer.getvalue()


def png_data_uri() -> str:
    return "data:image/png;base64," + base64.b64encode(png_bytes()).decode()


def first_frame(mp4: bytes) -> np.ndarray:
    import av

    with av.open(io.BytesIO(mp4)) as container:
        frame = next(container.decode(container.streams.video[0]))
        return np.asarray(frame.to_ndarray(format="rgb24"), dtype=np.float32)


def stored_file(videos: Videos, data: bytes) -> str:
    """A generated file of the account (what an image generation with `response_format: url` keeps),
    written through the server's own file service, so that no image model needs loading."""
    from modelhost.artifacts.s3 import blob_store_of
    from modelhost.services.files import FileService
    from modelhost.store.db import Database

    assert videos.settings is not None
    database = Database(videos.settings.database_url)
    try:
        files = FileService(database, blob_store_of(videos.settings), b"test", 600)
        return files.store(videos.account_id, data, "image/png", "png").id
    finally:
        database.dispose()


def test_the_sdk_creates_a_queued_job_that_completes_as_an_mp4_of_the_requested_frames_and_size(
    videos: Videos,
) -> None:
    client = videos.client()
    job = client.videos.create(
        model="t2v", prompt="a cat walking", seconds="1", size="64x48", extra_body=FAST
    )
    assert job.status == "queued" and job.object == "video" and job.model == "t2v" and job.progress == 0
    done = client.videos.poll(job.id)
    assert done.status == "completed" and done.progress == 100
    assert (
        done.completed_at is not None and done.expires_at is not None and done.expires_at > done.completed_at
    )
    content = client.videos.download_content(job.id).read()
    assert frames_of(content) == (8, 64, 48, 8.0)  # 1 s × the default 8 fps


def test_create_and_poll_and_a_json_body_with_numbers(videos: Videos) -> None:
    done = videos.client().videos.create_and_poll(
        model="t2v", prompt="a dog", seconds="1", size="32x32", extra_body={**FAST, "fps": 4}
    )
    assert done.status == "completed"
    created = videos.post(model="t2v", prompt="a dog", seconds=0.5, size="32x32", fps=12, **FAST)
    assert created.status_code == 200, created.text
    assert created.json()["seconds"] == 0.5 and created.json()["status"] == "queued"
    videos.wait(created.json()["id"])
    mp4 = videos.http.get(f"/v1/videos/{created.json()['id']}/content", headers=bearer(videos.key))
    assert mp4.headers["content-type"] == "video/mp4" and frames_of(mp4.content)[:1] == (6,)


def test_the_same_seed_gives_the_same_video(videos: Videos) -> None:
    client = videos.client()
    made = [
        client.videos.create_and_poll(model="t2v", prompt="a cat", seconds="1", size="32x32", extra_body=FAST)
        for _ in range(2)
    ]
    contents = [client.videos.download_content(v.id).read() for v in made]
    assert contents[0] == contents[1]


def test_content_and_remix_are_409_until_the_job_is_completed_and_the_poll_header_is_set(
    videos: Videos,
) -> None:
    job = videos.post(model="t2v", prompt="slow", seconds=1, size="32x32", num_inference_steps=400).json()
    retrieved = videos.http.get(f"/v1/videos/{job['id']}", headers=bearer(videos.key))
    assert retrieved.headers["openai-poll-after-ms"] == "50"
    for variant in ("video", "thumbnail", "spritesheet"):
        early = videos.http.get(
            f"/v1/videos/{job['id']}/content", params={"variant": variant}, headers=bearer(videos.key)
        )
        assert_error(early, 409, code="video_not_ready")
    with pytest.raises(openai.ConflictError):
        videos.client().videos.remix(job["id"], prompt="again")
    running = videos.wait(job["id"], until=("in_progress",))
    assert running["status"] == "in_progress"
    videos.http.delete(f"/v1/videos/{job['id']}", headers=bearer(videos.key))


def test_deleting_a_running_job_stops_its_generation(videos: Videos) -> None:
    job = videos.post(model="t2v", prompt="long", seconds=1, size="32x32", num_inference_steps=800).json()
    deadline = time.monotonic() + 60
    while videos.wait(job["id"], until=("in_progress",))["progress"] < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    deleted = videos.client().videos.delete(job["id"])
    assert (deleted.id, deleted.object, deleted.deleted) == (job["id"], "video.deleted", True)
    assert_error(
        videos.http.get(f"/v1/videos/{job['id']}", headers=bearer(videos.key)), 404, code="video_not_found"
    )
    assert_error(videos.http.delete(f"/v1/videos/{job['id']}", headers=bearer(videos.key)), 404)
    deadline = time.monotonic() + 10
    while generating(videos, videos.deployments["t2v"]) != 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert generating(videos, videos.deployments["t2v"]) == 0  # 800 steps would take far longer
    after = videos.post(model="t2v", prompt="next", seconds=1, size="32x32", **FAST).json()
    assert videos.wait(after["id"])["status"] == "completed"  # the replica is free again


def generating(videos: Videos, deployment_id: str) -> float:
    return deployment_metric(videos.http, "modelhost_generation_sequences", deployment_id, missing=-1.0)


def test_listing_pages_with_after_limit_and_order(videos: Videos) -> None:
    client = videos.client()
    made = [
        videos.post(model="t2v", prompt=f"p{i}", seconds=1, size="32x32", **FAST).json()["id"]
        for i in range(3)
    ]
    page = client.videos.list(limit=2)
    assert [v.id for v in page.data] == made[::-1][:2] and page.has_more
    rest = client.videos.list(limit=2, after=page.data[-1].id)
    assert rest.data[0].id == made[0]
    ascending = videos.http.get(
        "/v1/videos", params={"order": "asc", "limit": 100}, headers=bearer(videos.key)
    ).json()
    ids = [v["id"] for v in ascending["data"]]
    assert ids.index(made[0]) < ids.index(made[2]) and ascending["first_id"] == ids[0]
    for video_id in made:
        videos.wait(video_id)


def test_a_size_or_frame_count_the_model_cannot_make_fails_the_job_with_a_code(videos: Videos) -> None:
    job = videos.post(model="wan", prompt="x", seconds=1, size="32x32", **FAST).json()  # Wan: 1 + 4k frames
    failed = videos.wait(job["id"])
    assert failed["status"] == "failed" and failed["error"]["code"] == "invalid_size"
    assert "1 + 4" in failed["error"]["message"] and failed["completed_at"] is not None
    wan = videos.post(model="wan", prompt="x", seconds=1.125, size="32x32", **FAST).json()  # 9 frames
    assert videos.wait(wan["id"])["status"] == "completed"


def test_every_form_of_input_reference_makes_the_same_video_and_differs_from_none(videos: Videos) -> None:
    """A data URI as text (JSON), `{"image_url": data URI}` and `{"file_id"}` (as the SDK's form fields
    `input_reference[...]`) and a file upload all reach the model as the same image: same seed, same
    video; without a reference the video differs (the image guides generation). The SDK refuses an
    object in `input_reference=` itself (it wants a file there), so the objects go by `extra_body`."""
    client = videos.client()
    options: dict[str, Any] = {"model": "t2v", "prompt": "x", "seconds": "1", "size": "32x32"}
    as_text = videos.post(**options, input_reference=png_data_uri(), **FAST)
    assert as_text.status_code == 200, as_text.text
    file_id = stored_file(videos, png_bytes())
    made = [
        as_text.json()["id"],
        client.videos.create(
            **options, extra_body={**FAST, "input_reference": {"image_url": png_data_uri()}}
        ).id,
        client.videos.create(**options, extra_body={**FAST, "input_reference": {"file_id": file_id}}).id,
        client.videos.create(
            **options, input_reference=("ref.png", png_bytes(), "image/png"), extra_body=FAST
        ).id,
        client.videos.create(**options, extra_body=FAST).id,
    ]
    assert all(videos.wait(video_id)["status"] == "completed" for video_id in made)
    contents = [client.videos.download_content(video_id).read() for video_id in made]
    assert contents[0] == contents[1] == contents[2] == contents[3] != contents[4]


def test_a_model_that_takes_no_reference_fails_the_job_with_a_code(videos: Videos) -> None:
    wan = videos.post(
        model="wan", prompt="x", seconds=1.125, size="32x32", input_reference=png_data_uri(), **FAST
    )
    assert videos.wait(wan.json()["id"])["error"]["code"] == "input_reference_unsupported"


def test_an_unknown_file_id_is_a_400_naming_input_reference(videos: Videos) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        videos.client().videos.create(
            model="t2v",
            prompt="x",
            seconds="1",
            size="32x32",
            extra_body={"input_reference": {"file_id": "file_nope"}},
        )
    error = raised.value.body
    assert (
        isinstance(error, dict) and error["param"] == "input_reference" and error["code"] == "file_not_found"
    )


def test_a_remix_is_a_new_job_with_the_new_prompt_and_the_sources_other_options(videos: Videos) -> None:
    """Same prompt: the remix carries every option and the reference, so it is the same video, byte for
    byte; a new prompt makes another."""
    client = videos.client()
    source = client.videos.create_and_poll(
        model="t2v",
        prompt="a cat",
        seconds="1",
        size="48x32",
        extra_body={**FAST, "fps": 4, "input_reference": {"image_url": png_data_uri()}},
    )
    remix = client.videos.remix(source.id, prompt="a dog")
    assert (remix.status, remix.prompt, remix.remixed_from_video_id) == ("queued", "a dog", source.id)
    assert (remix.model, remix.seconds, remix.size) == (source.model, source.seconds, source.size)
    same = client.videos.remix(source.id, prompt="a cat")
    assert client.videos.retrieve(same.id).remixed_from_video_id == source.id
    assert source.remixed_from_video_id is None
    contents = [
        client.videos.download_content(video_id).read()
        for video_id in (source.id, videos.wait(remix.id)["id"], videos.wait(same.id)["id"])
    ]
    assert contents[0] == contents[2] != contents[1]
    assert frames_of(contents[1]) == (4, 48, 32, 4.0)


def test_a_remix_of_an_unknown_video_is_404_and_takes_only_a_prompt(videos: Videos) -> None:
    with pytest.raises(openai.NotFoundError):
        videos.client().videos.remix("video_unknown", prompt="x")
    done = videos.post(model="t2v", prompt="x", seconds=1, size="32x32", **FAST).json()
    videos.wait(done["id"])
    remix = f"/v1/videos/{done['id']}/remix"
    assert_error(
        videos.http.post(remix, json={"prompt": "y", "seconds": 2}, headers=bearer(videos.key)),
        400,
        param="seconds",
    )
    assert_error(
        videos.http.post(remix, json={"prompt": ""}, headers=bearer(videos.key)), 400, param="prompt"
    )


def test_the_thumbnail_is_the_first_frame_and_the_spritesheet_a_grid_of_frames(videos: Videos) -> None:
    from PIL import Image

    client = videos.client()
    job = client.videos.create_and_poll(
        model="t2v", prompt="a cat", seconds="1", size="48x32", extra_body=FAST
    )
    mp4 = client.videos.download_content(job.id, variant="video")
    assert mp4.response.headers["content-type"] == "video/mp4" and frames_of(mp4.read())[:3] == (8, 48, 32)
    thumbnail = client.videos.download_content(job.id, variant="thumbnail")
    assert thumbnail.response.headers["content-type"] == "image/webp"
    image = Image.open(io.BytesIO(thumbnail.read()))
    assert (image.format, image.size) == ("WEBP", (48, 32))
    pixels = np.asarray(image.convert("RGB"), dtype=np.float32)
    assert np.abs(pixels - first_frame(mp4.read())).mean() < 12  # both lossy, of the same frame
    sheet = client.videos.download_content(job.id, variant="spritesheet")
    assert sheet.response.headers["content-type"] == "image/jpeg"
    grid = Image.open(io.BytesIO(sheet.read()))
    assert (grid.format, grid.size) == ("JPEG", (4 * 48, 2 * 32))  # 8 frames, 4 to a row, at full size
    tile = np.asarray(grid.convert("RGB"), dtype=np.float32)[:32, :48]
    assert np.abs(tile - pixels).mean() < 12  # the first tile is the first frame


def test_an_unknown_variant_is_a_400_naming_variant(videos: Videos) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        videos.client().videos.download_content("video_any", variant="poster")  # type: ignore[arg-type]
    assert isinstance(raised.value.body, dict) and raised.value.body["param"] == "variant"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"size": "big"}, "size"),
        ({"size": "0x32"}, "size"),
        ({"seconds": 0}, "seconds"),
        ({"seconds": "four"}, "seconds"),
        ({"seconds": 600, "fps": 60}, "seconds"),
        ({"fps": 0}, "fps"),
        ({"input_reference": "http://10.0.0.1/cat.png"}, "input_reference"),
        ({"input_reference": "not base64!"}, "input_reference"),
        ({"input_reference": "/etc/passwd"}, "input_reference"),
        ({"prompt": ""}, "prompt"),
        ({"input_reference": {"image_url": "data:,x", "file_id": "file_1"}}, "input_reference"),
        ({"input_reference": {"url": "http://example.com/cat.png"}}, "input_reference"),
        ({"input_reference": {"image_url": "http://10.0.0.1/cat.png"}}, "input_reference"),
        ({"promtp": "x"}, "promtp"),
    ],
)
def test_bad_inputs_are_400_naming_the_field(videos: Videos, fields: dict[str, Any], param: str) -> None:
    body = {"model": "t2v", "prompt": "x", "seconds": 1, "size": "32x32", **fields}
    assert_error(videos.post(**body), 400, param=param)


def test_unknown_models_and_other_pipelines_are_refused(videos: Videos) -> None:
    assert_error(videos.post(model="sora-2", prompt="x"), 404, code="model_not_found")
    form = videos.http.post(
        "/v1/videos", data={"model": "t2v", "prompt": "x", "seconds": "abc"}, headers=bearer(videos.key)
    )
    assert_error(form, 400, param="seconds")


# ---------------------------------------------------------------- restarts


def until_claimed(database_url: str, job_id: str, attempt: int, timeout: float = 120) -> None:
    """Wait until a gateway runs the job for the `attempt`-th time."""
    from modelhost.store.db import Database
    from modelhost.store.models import VideoJob

    database, deadline = Database(database_url), time.monotonic() + timeout
    try:
        while True:
            with database.transaction() as session:
                job = session.get(VideoJob, job_id)
                if job is not None and job.status == "in_progress" and job.attempts == attempt:
                    return
            assert time.monotonic() < deadline, f"job {job_id} not claimed a {attempt}th time"
            time.sleep(0.05)
    finally:
        database.dispose()


def test_a_job_interrupted_by_a_crash_runs_again_then_fails_if_interrupted_twice(
    tmp_path: Path, recipes: Path
) -> None:
    server = ServerProcess(
        tmp_path / "data",
        f"sqlite:///{tmp_path / 'db.sqlite'}",
        MODELHOST_VIDEO_JOB_STALE_SECONDS="2",
        MODELHOST_VIDEO_POLL_SECONDS="0.05",
        MODELHOST_WORKER_THREADS="1",
    )
    server.start()
    try:
        http = httpx.Client(base_url=server.url, timeout=120)
        key = http.post("/v1/admin/accounts", json={"name": "r"}, headers=bearer(ADMIN_KEY)).json()["api_key"]
        deploy(http, key, recipes / "t14_diffusers_text_to_video" / "text_to_video_sd", "t2v")
        view = Videos(server.url, key, http, {})
        quick = view.post(model="t2v", prompt="x", seconds=1, size="32x32", num_inference_steps=12).json()
        running = view.wait(quick["id"], until=("in_progress",))
        assert running["status"] == "in_progress"
        server.kill()
        server.start()
        assert view.wait(quick["id"])["status"] == "completed"  # re-queued once, then run to the end

        slow = view.post(model="t2v", prompt="x", seconds=1, size="32x32", num_inference_steps=800).json()
        for attempt in (1, 2):
            # Claimed anew (the row still reads `in_progress` from the killed server until it is re-queued).
            until_claimed(f"sqlite:///{tmp_path / 'db.sqlite'}", slow["id"], attempt)
            server.kill()
            server.start()
        failed = view.wait(slow["id"], until=("failed",))
        assert failed["error"]["code"] == "interrupted"
        assert http.delete(f"/v1/videos/{slow['id']}", headers=bearer(key)).status_code == 200
    finally:
        server.stop()
