//! Tests of the TensorBoard event files: the CRC and record encoding, round trips of scalars and
//! images, corrupt and truncated files, and resumed runs.

use super::*;
use crate::plot::{line_panels, LineAxes, Panel, Series};

/// A real PNG drawn by the plotting code the trainer uses (520x400 per panel).
fn sample_png(dir: &Path) -> Vec<u8> {
    let path = dir.join("sample.png");
    let panel = Panel {
        title: "spectrum".into(),
        series: vec![Series {
            label: "eigenvalue 1".into(),
            points: (0..10)
                .map(|i| (i as f64, 1.0 / (1.0 + i as f64)))
                .collect(),
        }],
    };
    let axes = LineAxes {
        x_label: "step",
        y_label: "eigenvalue",
        log_y: true,
    };
    line_panels(&path, &[panel], &axes).unwrap();
    std::fs::read(&path).unwrap()
}

fn steps_of(events: &Events, tag: &str) -> Vec<(u64, f32)> {
    events
        .scalars
        .iter()
        .filter(|s| s.tag == tag)
        .map(|s| (s.step, s.value))
        .collect()
}

#[test]
fn crc32c_matches_the_known_check_value() {
    assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    assert_eq!(crc32c(b""), 0);
    // 32 zero bytes: RFC 3720 (iSCSI), appendix B.4.
    assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
}

/// Records as TensorBoard's own protobuf classes and masked CRC serialise them
/// (`tensorboard.compat.proto.event_pb2`, `tensorflow_stub.pywrap_tensorflow.masked_crc32c`).
#[test]
fn records_match_tensorboards_own_encoding() {
    let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
    assert_eq!(masked_crc(b""), 0xa282_ead8);
    assert_eq!(masked_crc(b"hello"), 0x191c_1fbb);
    let header = encode_event(1.5, 0, Some(FILE_VERSION), None);
    assert_eq!(
        hex(&header),
        "09000000000000f83f1a0d627261696e2e4576656e743a32"
    );
    let loss = frame(&encode_event(
        1.5,
        7,
        None,
        Some(&scalar_value("loss", 0.5)),
    ));
    assert_eq!(
        hex(&loss),
        "1a00000000000000129bd82d09000000000000f83f10072a0d0a0b0a046c6f7373150000003f79e18fbb"
    );
}

#[test]
fn scalars_and_an_image_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let tb = dir.path().join("tb");
    let png = sample_png(dir.path());
    let mut writer = EventWriter::open(&tb, None).unwrap();
    assert!(writer
        .path()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .starts_with(EVENT_FILE_PREFIX));
    for step in 0..5u64 {
        writer
            .scalar("train/loss", step, 1.0 / (step as f64 + 1.0))
            .unwrap();
        writer.scalar("train/lr", step, 0.1 * step as f64).unwrap();
    }
    writer.image("spectrum", 4, &png).unwrap();
    writer.scalar("eval/knn_accuracy", 5, 0.625).unwrap();
    writer.flush().unwrap();
    let events = read_dir(&tb).unwrap();
    let loss: Vec<_> = (0..5)
        .map(|s| (s, (1.0 / (s as f64 + 1.0)) as f32))
        .collect();
    assert_eq!(steps_of(&events, "train/loss"), loss);
    let lr: Vec<_> = (0..5).map(|s| (s, (0.1 * s as f64) as f32)).collect();
    assert_eq!(steps_of(&events, "train/lr"), lr);
    assert_eq!(events.scalar_at("eval/knn_accuracy", 5), vec![0.625]);
    assert_eq!(
        events.images,
        vec![ImageEvent {
            tag: "spectrum".into(),
            step: 4,
            width: 520,
            height: 400,
            png
        }]
    );
}

#[test]
fn a_non_png_image_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut writer = EventWriter::open(dir.path(), None).unwrap();
    let err = writer
        .image("plot", 0, b"GIF89a not a png at all")
        .unwrap_err();
    assert!(format!("{err:#}").contains("not a PNG"), "{err:#}");
}

#[test]
fn a_corrupted_byte_is_reported_with_file_and_offset() {
    let dir = tempfile::tempdir().unwrap();
    let mut writer = EventWriter::open(dir.path(), None).unwrap();
    for step in 0..4 {
        writer.scalar("loss", step, step as f64).unwrap();
    }
    writer.flush().unwrap();
    let path = writer.path().to_path_buf();
    drop(writer);
    let mut bytes = std::fs::read(&path).unwrap();
    // Flip a byte of the second scalar record's data.
    let second = split_records(&bytes, &path).unwrap().records[2].0.start;
    bytes[second + 14] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    let err = format!("{:#}", read_dir(dir.path()).unwrap_err());
    assert!(err.contains(&name), "{err}");
    assert!(err.contains(&format!("byte offset {second}")), "{err}");
    assert!(err.contains("corrupt"), "{err}");
    // Resuming does not silently drop a corrupt record either.
    let err = format!(
        "{:#}",
        EventWriter::open(dir.path(), Some(10)).err().unwrap()
    );
    assert!(err.contains(&name) && err.contains("corrupt"), "{err}");
    // A corrupted length is caught by the length's CRC.
    bytes[second + 14] ^= 0x40;
    bytes[second] ^= 0x01;
    std::fs::write(&path, &bytes).unwrap();
    let err = format!("{:#}", read_dir(dir.path()).unwrap_err());
    assert!(err.contains("length fails"), "{err}");
}

#[test]
fn resume_drops_the_steps_from_the_checkpoint_on() {
    let dir = tempfile::tempdir().unwrap();
    let png = sample_png(dir.path());
    let tb = dir.path().join("tb");
    let mut first = EventWriter::open(&tb, None).unwrap();
    for step in 0..10 {
        first.scalar("loss", step, step as f64).unwrap();
    }
    first.image("spectrum", 3, &png).unwrap();
    first.image("spectrum", 8, &png).unwrap();
    first.flush().unwrap();
    drop(first);
    // Killed after step 9; the last checkpoint was taken after 6 steps.
    let mut resumed = EventWriter::open(&tb, Some(6)).unwrap();
    for step in 6..12 {
        resumed.scalar("loss", step, 100.0 + step as f64).unwrap();
    }
    resumed.flush().unwrap();
    let events = read_dir(&tb).unwrap();
    let expected: Vec<_> = (0..12)
        .map(|s| (s, if s < 6 { s as f32 } else { 100.0 + s as f32 }))
        .collect();
    assert_eq!(steps_of(&events, "loss"), expected);
    let image_steps: Vec<_> = events.images.iter().map(|i| i.step).collect();
    assert_eq!(image_steps, vec![3]);
    assert_eq!(event_files(&tb).unwrap().len(), 2);
    // A resume from step 0 leaves nothing of the earlier files.
    drop(resumed);
    let restarted = EventWriter::open(&tb, Some(0)).unwrap();
    assert_eq!(
        event_files(&tb).unwrap(),
        vec![restarted.path().to_path_buf()]
    );
    assert!(read_dir(&tb).unwrap().scalars.is_empty());
}

#[test]
fn a_fresh_run_removes_earlier_event_files() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = EventWriter::open(dir.path(), None).unwrap();
    first.scalar("loss", 0, 5.0).unwrap();
    first.flush().unwrap();
    drop(first);
    let mut second = EventWriter::open(dir.path(), None).unwrap();
    second.scalar("loss", 0, 7.0).unwrap();
    second.flush().unwrap();
    assert_eq!(
        read_dir(dir.path()).unwrap().scalar_at("loss", 0),
        vec![7.0]
    );
    assert_eq!(event_files(dir.path()).unwrap().len(), 1);
}

#[test]
fn a_truncated_tail_is_reported_and_dropped_on_resume() {
    let dir = tempfile::tempdir().unwrap();
    let mut writer = EventWriter::open(dir.path(), None).unwrap();
    for step in 0..5 {
        writer.scalar("loss", step, step as f64).unwrap();
    }
    writer.flush().unwrap();
    let path = writer.path().to_path_buf();
    drop(writer);
    let bytes = std::fs::read(&path).unwrap();
    let last = split_records(&bytes, &path).unwrap().records[5].0.clone();
    // Killed mid-write: the last record's first 7 bytes made it to disk, then only 3.
    for cut in [last.start + 7, last.start + 3] {
        std::fs::write(&path, &bytes[..cut]).unwrap();
        let err = format!("{:#}", read_dir(dir.path()).unwrap_err());
        assert!(
            err.contains("truncated") && err.contains(&format!("byte offset {}", last.start)),
            "{err}"
        );
    }
    // A checkpoint later than every logged step: only the cut record goes.
    let mut resumed = EventWriter::open(dir.path(), Some(100)).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), bytes[..last.start]);
    resumed.scalar("loss", 5, 50.0).unwrap();
    resumed.flush().unwrap();
    let events = read_dir(dir.path()).unwrap();
    let expected: Vec<_> = (0..4).map(|s| (s, s as f32)).chain([(5, 50.0)]).collect();
    assert_eq!(steps_of(&events, "loss"), expected);
    // No temporary file is left behind.
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().all(|n| n.starts_with(EVENT_FILE_PREFIX)),
        "{names:?}"
    );
}

/// A run's `metrics.jsonl` and TensorBoard directory as `runlog` writes them (step records;
/// `epoch_end` records stamped with the steps taken, drawn at the epoch's last step), killed
/// mid-epoch (a record torn) after a checkpoint and resumed, `metrics.jsonl` cut back to the
/// checkpoint: every number in `metrics.jsonl` must be in the event files at its step, once.
/// With `SSL_TENSORBOARD_SAMPLE=DIR` the run is written to `DIR` (for
/// `tools/tensorboard_check.py DIR/tb DIR/metrics.jsonl`).
#[test]
fn a_killed_and_resumed_run_matches_its_metrics() {
    let temp = tempfile::tempdir().unwrap();
    let dir =
        std::env::var_os("SSL_TENSORBOARD_SAMPLE").map_or(temp.path().to_path_buf(), PathBuf::from);
    std::fs::create_dir_all(&dir).unwrap();
    let png = sample_png(temp.path());
    let tb = dir.join("tb");
    let steps_per_epoch = 4;
    let run = |writer: &mut EventWriter, steps: Range<u64>, lines: &mut Vec<serde_json::Value>| {
        for step in steps {
            let x = step as f64;
            let record = serde_json::json!({"step": step, "epoch": step / steps_per_epoch,
                "loss": 3.0 / (1.0 + x), "lr": 0.3 * x / 7.0, "images_per_s": 1234.5 + x,
                "invariance": 0.1 + 1e-9 * x, "data_wait_ms": 0.0});
            lines.push(record.clone());
            for (key, value) in record.as_object().unwrap() {
                if !["step", "epoch"].contains(&key.as_str()) {
                    writer.scalar(key, step, value.as_f64().unwrap()).unwrap();
                }
            }
            if (step + 1) % steps_per_epoch == 0 {
                let end = serde_json::json!({"epoch_end": step / steps_per_epoch,
                    "step": step + 1, "knn_accuracy": 0.1 * x / 3.0,
                    "online_probe_accuracy": null});
                lines.push(end.clone());
                writer
                    .scalar("knn_accuracy", step, end["knn_accuracy"].as_f64().unwrap())
                    .unwrap();
                writer.image("spectrum", step, &png).unwrap();
                writer.flush().unwrap();
            }
        }
    };
    let mut lines = Vec::new();
    let mut first = EventWriter::open(&tb, None).unwrap();
    run(&mut first, 0..6, &mut lines);
    first.flush().unwrap();
    let torn = first.path().to_path_buf();
    drop(first);
    let bytes = std::fs::read(&torn).unwrap();
    std::fs::write(&torn, &bytes[..bytes.len() - 5]).unwrap();
    // The checkpoint after epoch 0 (4 steps): metrics.jsonl is cut back as `runlog` does.
    lines.retain(|r| match r.get("epoch_end") {
        Some(epoch) => epoch.as_u64().unwrap() < 1,
        None => r["step"].as_u64().unwrap() < 4,
    });
    let mut resumed = EventWriter::open(&tb, Some(4)).unwrap();
    run(&mut resumed, 4..12, &mut lines);
    resumed.image("embedding", 11, &png).unwrap();
    resumed.flush().unwrap();
    drop(resumed);
    let text: String = lines.iter().map(|r| format!("{r}\n")).collect();
    std::fs::write(dir.join("metrics.jsonl"), text).unwrap();

    let events = read_dir(&tb).unwrap();
    let mut expected = Vec::new();
    for line in std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
    {
        let record: serde_json::Value = serde_json::from_str(line).unwrap();
        let step = record["step"].as_u64().unwrap();
        let board_step = match record.get("epoch_end") {
            Some(_) => step - 1,
            None => step,
        };
        for (key, value) in record.as_object().unwrap() {
            if let (false, Some(v)) = (key == "step" || key.starts_with("epoch"), value.as_f64()) {
                expected.push((key.clone(), board_step, v as f32));
            }
        }
    }
    assert_eq!(expected.len(), 12 * 5 + 3);
    for (tag, step, value) in &expected {
        assert_eq!(
            events.scalar_at(tag, *step),
            vec![*value],
            "{tag} at step {step}"
        );
    }
    assert_eq!(events.scalars.len(), expected.len());
    let images: Vec<_> = events
        .images
        .iter()
        .map(|i| (i.tag.as_str(), i.step))
        .collect();
    assert_eq!(
        images,
        [
            ("spectrum", 3),
            ("spectrum", 7),
            ("spectrum", 11),
            ("embedding", 11)
        ]
    );
}
