//! The two plain types the crops and the resampler share: an 8-bit image as a data set stores
//! it, and a box of pixels on it.

/// One stored image: `pixels` are `[height, width, channels]` (HWC) 8-bit values.
#[derive(Debug, Clone, Copy)]
pub struct StoredImage<'a> {
    pub pixels: &'a [u8],
    pub height: usize,
    pub width: usize,
    pub channels: usize,
}

/// A crop box in pixels: rows `top..top+height`, columns `left..left+width`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CropBox {
    pub top: usize,
    pub left: usize,
    pub height: usize,
    pub width: usize,
}
