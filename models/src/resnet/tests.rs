use std::collections::BTreeMap;

use candle_core::{DType, Device, Tensor, Var};
use ssl_core::ParamStore;

use super::*;
use crate::util::testing::{finite_diff_step, max_abs_diff, rand_tensor};

/// `key → shape` of a committed state-dict listing (`models/tests/fixtures/*.tsv`, made by
/// `make_key_fixtures.py` from torchvision / timm), without what our encoders deliberately lack:
/// the classifier (`fc.*`) and the `num_batches_tracked` counters (PyTorch fills them in when
/// loading a state dict that has none).
fn fixture(text: &str) -> BTreeMap<String, Vec<usize>> {
    text.lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (key, shape) = l.split_once('\t').expect("key<TAB>shape");
            let dims = shape
                .split(',')
                .filter(|d| !d.is_empty())
                .map(|d| d.parse().expect("dimension"))
                .collect();
            (key.to_string(), dims)
        })
        .filter(|(k, _)| !k.starts_with("fc.") && !k.ends_with("num_batches_tracked"))
        .collect()
}

fn our_keys(cfg: &ResNetConfig) -> BTreeMap<String, Vec<usize>> {
    let store = ssl_core::ParamStore::new(0);
    ResNet::new(cfg, store.var_builder(&Device::Cpu)).unwrap();
    store
        .vars()
        .into_iter()
        .map(|(k, v)| (k, v.dims().to_vec()))
        .collect()
}

#[test]
fn keys_and_shapes_equal_torchvision_resnet18_and_resnet50() {
    for (depth, text) in [
        (
            18,
            include_str!("../../tests/fixtures/torchvision_resnet18.tsv"),
        ),
        (
            50,
            include_str!("../../tests/fixtures/torchvision_resnet50.tsv"),
        ),
    ] {
        let cfg = ResNetConfig::new(depth, Stem::Imagenet, 3).unwrap();
        let expected = fixture(text);
        assert!(
            expected.len() >= 100,
            "fixture for resnet{depth} looks empty"
        );
        assert_eq!(our_keys(&cfg), expected, "resnet{depth}");
    }
}

#[test]
fn resnet34_and_the_3d_resnet18_have_the_expected_layout() {
    let keys = our_keys(&ResNetConfig::new(34, Stem::Imagenet, 3).unwrap());
    assert!(keys.contains_key("layer3.5.bn2.running_var"));
    assert!(!keys.contains_key("layer3.6.conv1.weight"));
    assert_eq!(keys["layer2.0.downsample.0.weight"], vec![128, 64, 1, 1]);
    let keys = our_keys(&ResNetConfig::resnet18_3d());
    assert_eq!(keys["conv1.weight"], vec![64, 1, 7, 7, 7]);
    assert_eq!(keys["layer4.1.conv2.weight"], vec![512, 512, 3, 3, 3]);
    assert_eq!(
        keys["layer4.0.downsample.0.weight"],
        vec![512, 256, 1, 1, 1]
    );
    assert_eq!(keys["fc.weight"], vec![512, 512]);
    // The same keys as the 2D ResNet-18 plus the fc, with 3D kernels.
    let flat = our_keys(&ResNetConfig::new(18, Stem::Imagenet, 1).unwrap());
    let mut without_fc = keys.clone();
    without_fc.retain(|k, _| !k.starts_with("fc."));
    assert_eq!(
        without_fc.keys().collect::<Vec<_>>(),
        flat.keys().collect::<Vec<_>>()
    );
}

#[test]
fn output_shapes_of_both_stems_and_the_3d_net() {
    let dev = Device::Cpu;
    let cases: Vec<(ResNetConfig, Vec<usize>, usize)> = vec![
        (
            ResNetConfig::new(18, Stem::Cifar, 3).unwrap(),
            vec![2, 3, 16, 16],
            512,
        ),
        (
            ResNetConfig::new(18, Stem::Imagenet, 3).unwrap(),
            vec![2, 3, 40, 40],
            512,
        ),
        (
            ResNetConfig::new(50, Stem::Cifar, 1).unwrap(),
            vec![2, 1, 8, 8],
            2048,
        ),
        (ResNetConfig::resnet18_3d(), vec![2, 1, 12, 12, 12], 512),
    ];
    for (cfg, shape, out) in cases {
        let store = ssl_core::ParamStore::new(1);
        let net = ResNet::new(&cfg, store.var_builder(&dev)).unwrap();
        assert_eq!(net.output_dim(), out);
        let x = rand_tensor(2, &shape, DType::F32);
        for train in [true, false] {
            let y = net.forward_t(&x, train).unwrap();
            assert_eq!(y.dims(), &[2, out], "{cfg:?} train={train}");
        }
    }
    // A 2D net refuses a volume, naming the expected layout.
    let store = ssl_core::ParamStore::new(1);
    let net = ResNet::new(
        &ResNetConfig::new(18, Stem::Cifar, 1).unwrap(),
        store.var_builder(&dev),
    )
    .unwrap();
    let err = net
        .forward_t(&rand_tensor(3, &[2, 1, 8, 8, 8], DType::F32), true)
        .unwrap_err()
        .to_string();
    assert!(err.contains("[N, C, H, W]"), "{err}");
    assert!(ResNetConfig::new(101, Stem::Cifar, 3).is_err());
}

#[test]
fn init_is_torchvision_kaiming_fan_out_and_zero_init_residual_zeroes_the_last_bn() {
    let store = ssl_core::ParamStore::new(4);
    let mut cfg = ResNetConfig::new(50, Stem::Imagenet, 3).unwrap();
    cfg.zero_init_residual = true;
    ResNet::new(&cfg, store.var_builder(&Device::Cpu)).unwrap();
    let t = store.tensors();
    let std_of = |k: &str| -> f64 {
        let v: Vec<f32> = t[k].flatten_all().unwrap().to_vec1().unwrap();
        (v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>() / v.len() as f64).sqrt()
    };
    // fan_out = out channels × kernel area; std = sqrt(2 / fan_out).
    for (key, fan_out) in [
        ("layer3.0.conv2.weight", 256.0 * 9.0),
        ("layer4.2.conv3.weight", 2048.0),
    ] {
        let expected = (2.0f64 / fan_out).sqrt();
        let got = std_of(key);
        assert!(
            (got / expected - 1.0).abs() < 0.02,
            "{key}: {got} vs {expected}"
        );
    }
    let sum_abs = |k: &str| {
        t[k].abs()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
    };
    assert_eq!(sum_abs("layer1.0.bn3.weight"), 0.0);
    assert_eq!(sum_abs("layer4.2.bn3.weight"), 0.0);
    assert_eq!(sum_abs("layer1.0.bn2.weight"), 64.0);
    assert_eq!(sum_abs("layer1.0.downsample.1.weight"), 256.0);
}

#[test]
fn zero_init_residual_blocks_start_as_the_identity() {
    // With the last BN at weight 0 and bias 0, a block without projection computes relu(x).
    let store = ssl_core::ParamStore::new(5);
    let mut cfg = ResNetConfig::new(18, Stem::Cifar, 3).unwrap();
    cfg.zero_init_residual = true;
    let vb = store.var_builder(&Device::Cpu);
    let block = Block::new(&cfg, 64, 64, 1, vb.pp("b")).unwrap();
    let x = rand_tensor(6, &[64, 2, 5, 5], DType::F32);
    let y = block.forward(&x, true).unwrap();
    assert_eq!(max_abs_diff(&y, &x.relu().unwrap()), 0.0);
}

/// A network in f64 (seeded initialisation) for finite differences.
fn f64_net(cfg: &ResNetConfig) -> ResNet {
    let vb = ParamStore::new(7)
        .var_builder(&Device::Cpu)
        .set_dtype(DType::F64);
    ResNet::new(cfg, vb).unwrap()
}

fn check_input_gradient(cfg: &ResNetConfig, shape: &[usize]) {
    let net = f64_net(cfg);
    let x0 = rand_tensor(7, shape, DType::F64);
    let r = rand_tensor(8, &[shape[0], net.output_dim()], DType::F64);
    let loss = |x: &Tensor| {
        (net.forward_t(x, true).unwrap() * &r)
            .unwrap()
            .sum_all()
            .unwrap()
    };
    let x = Var::from_tensor(&x0).unwrap();
    let grads = loss(x.as_tensor()).backward().unwrap();
    let g: Vec<f64> = grads
        .get(&x)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    let step = (g.len() / 9).max(1);
    for i in (0..g.len()).step_by(step) {
        let fd = finite_diff_step(&x0, i, 1e-7, &|xp| loss(xp).to_scalar::<f64>().unwrap());
        let tol = 1e-5 * (1.0 + fd.abs());
        assert!((fd - g[i]).abs() < tol, "{cfg:?} dx[{i}]: {fd} vs {}", g[i]);
    }
}

/// Finite differences are only accurate where no batch norm averages over a handful of values
/// (then the loss is steep): inputs large enough for the last stage to keep ≥ 8 values per
/// channel. The step is small (1e-7) because with ~10⁵ ReLUs a step of 1e-5 moves some
/// pre-activation across zero more often than not.
#[test]
fn input_gradients_match_finite_differences_through_whole_networks() {
    check_input_gradient(
        &ResNetConfig::new(18, Stem::Cifar, 2).unwrap(),
        &[4, 2, 12, 12],
    );
    let mut bottleneck = ResNetConfig::new(50, Stem::Imagenet, 1).unwrap();
    bottleneck.layers = [1, 1, 1, 1];
    check_input_gradient(&bottleneck, &[4, 1, 48, 48]);
    let mut small_3d = ResNetConfig::resnet18_3d();
    small_3d.layers = [1, 1, 1, 1];
    check_input_gradient(&small_3d, &[8, 1, 16, 16, 16]);
}
