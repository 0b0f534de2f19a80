//! The status codes of replies (`google.rpc.Code` values).

/// `google.rpc.Code` values the daemon replies with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum StatusCode {
    Ok = 0,
    InvalidArgument = 3,
    NotFound = 5,
    AlreadyExists = 6,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    FailedPrecondition = 9,
    Internal = 13,
    Unavailable = 14,
}

/// Every code, in a fixed order.
pub const ALL_CODES: [StatusCode; 9] = [
    StatusCode::Ok,
    StatusCode::InvalidArgument,
    StatusCode::NotFound,
    StatusCode::AlreadyExists,
    StatusCode::PermissionDenied,
    StatusCode::ResourceExhausted,
    StatusCode::FailedPrecondition,
    StatusCode::Internal,
    StatusCode::Unavailable,
];

impl StatusCode {
    pub fn name(self) -> &'static str {
        match self {
            StatusCode::Ok => "OK",
            StatusCode::InvalidArgument => "INVALID_ARGUMENT",
            StatusCode::NotFound => "NOT_FOUND",
            StatusCode::AlreadyExists => "ALREADY_EXISTS",
            StatusCode::PermissionDenied => "PERMISSION_DENIED",
            StatusCode::ResourceExhausted => "RESOURCE_EXHAUSTED",
            StatusCode::FailedPrecondition => "FAILED_PRECONDITION",
            StatusCode::Internal => "INTERNAL",
            StatusCode::Unavailable => "UNAVAILABLE",
        }
    }
}
